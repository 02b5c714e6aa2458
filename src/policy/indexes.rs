//! Rule family (being written).

use super::evaluate::Emitter;
use crate::command::{CommandError, CommandView};

pub(crate) fn check<'a>(
    _view: &CommandView<'a>,
    _em: &mut Emitter<'_, 'a>,
) -> Result<(), CommandError> {
    Ok(())
}
