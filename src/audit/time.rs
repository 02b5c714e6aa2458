//! RFC 3339 timestamps without a date library.

use std::{
    fmt::Write as _,
    time::{SystemTime, UNIX_EPOCH},
};

/// Appends `t` as RFC 3339 UTC with milliseconds, `2024-05-01T12:34:56.789Z` (truncated,
/// not rounded, to the millisecond; times before 1970 are handled).
pub(crate) fn format_time(t: SystemTime, out: &mut String) {
    let nanos: i128 = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    };
    let millis = nanos.div_euclid(1_000_000);
    let days = millis.div_euclid(86_400_000);
    let ms_of_day = millis.rem_euclid(86_400_000);
    // SystemTime spans far fewer than i64::MAX days on every platform.
    let (y, m, d) = civil_from_days(days as i64);
    let secs = ms_of_day / 1000;
    let _ = write!(
        out,
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        ms_of_day % 1000
    );
}

/// Appends `t` as an RFC 3164 timestamp, `May  1 12:34:56` (UTC: the format has no zone).
pub(crate) fn format_time_3164(t: SystemTime, out: &mut String) {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs: i64 = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64) - 1,
    };
    let days = secs.div_euclid(86_400);
    let s = secs.rem_euclid(86_400);
    let (_, m, d) = civil_from_days(days);
    let _ = write!(
        out,
        "{} {d:>2} {:02}:{:02}:{:02}",
        MONTHS
            .get((m as usize).wrapping_sub(1))
            .copied()
            .unwrap_or("Jan"),
        s / 3600,
        s / 60 % 60,
        s % 60
    );
}

/// (year, month, day) of the proleptic Gregorian calendar for days since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32; // [1, 12]
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn time(t: SystemTime) -> String {
        let mut s = String::new();
        format_time(t, &mut s);
        s
    }

    #[test]
    fn time_is_rfc3339_utc_millis() {
        assert_eq!(time(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let at = |ms: u64| time(UNIX_EPOCH + Duration::from_millis(ms));
        assert_eq!(at(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(1_709_251_199_999), "2024-02-29T23:59:59.999Z");
        assert_eq!(at(1_735_689_599_000), "2024-12-31T23:59:59.000Z");
        assert_eq!(at(4_102_444_800_000), "2100-01-01T00:00:00.000Z");
        // Sub-millisecond parts are truncated, before and after the epoch.
        assert_eq!(
            time(UNIX_EPOCH + Duration::from_micros(1_999)),
            "1970-01-01T00:00:00.001Z"
        );
        assert_eq!(
            time(UNIX_EPOCH - Duration::from_micros(1)),
            "1969-12-31T23:59:59.999Z"
        );
        assert_eq!(
            time(UNIX_EPOCH - Duration::from_secs(86_400 * 365)),
            "1969-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn rfc3164_time() {
        let at = |secs: u64| {
            let mut s = String::new();
            format_time_3164(UNIX_EPOCH + Duration::from_secs(secs), &mut s);
            s
        };
        assert_eq!(at(0), "Jan  1 00:00:00");
        assert_eq!(at(1_709_251_199), "Feb 29 23:59:59");
        assert_eq!(at(1_735_689_599), "Dec 31 23:59:59");
    }
}
