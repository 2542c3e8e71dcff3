//! AdmissionReview (`admission.k8s.io/v1`) in and out. Only the fields the
//! rules need are read; the answer echoes the request's uid.

use serde::Deserialize;
use serde_json::{Value, json};

use super::Refusal;

#[derive(Deserialize, Debug)]
pub struct Review {
    pub request: Request,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub uid: String,
    pub operation: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// The answer: allowed, or refused with the code's HTTP status and a
/// message that starts with the code.
pub fn answer(uid: &str, refusal: Option<&Refusal>) -> Value {
    let response = match refusal {
        None => json!({"uid": uid, "allowed": true}),
        Some(r) => json!({
            "uid": uid,
            "allowed": false,
            "status": {
                "code": r.code.http_status(),
                "reason": r.code.as_str(),
                "message": r.message(),
            },
        }),
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangar_crds::ErrorCode;

    #[test]
    fn a_refusal_carries_the_code_first_and_its_http_status() {
        let r = Refusal::new(ErrorCode::SandboxCommandLimit, "a session takes at most 247 commands");
        let v = answer("abc", Some(&r));
        assert_eq!(v["response"]["uid"], "abc");
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"]["code"], 409);
        assert_eq!(v["response"]["status"]["message"], "sandbox_command_limit: a session takes at most 247 commands");
        assert_eq!(answer("x", None)["response"]["allowed"], true);
    }
}
