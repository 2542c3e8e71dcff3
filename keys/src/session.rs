//! The session key: 64 random bytes per session (the workspace encryption
//! key), kept only sealed under the organisation key. Destroying the
//! sealed copy destroys the key.

use crate::seal::{KeyBytes, SealError, random_key};

pub const SESSION_KEY_LEN: usize = 64;

pub fn new_session_key() -> Result<KeyBytes<SESSION_KEY_LEN>, SealError> {
    random_key()
}
