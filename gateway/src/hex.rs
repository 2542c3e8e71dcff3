//! Lower-case hex, and the hex SHA-256 the gateway names and marks objects
//! by (Idempotency-Key names, request digests).

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}
