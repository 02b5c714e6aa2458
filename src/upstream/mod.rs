//! upstream
