//! AdmissionReview (`admission.k8s.io/v1`) in and out, with kube's
//! admission types; the answer echoes the request's uid, and a refusal
//! carries its code's HTTP status and a message that starts with the code.

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};

use super::Refusal;

/// The answer to `request`: allowed, or refused.
pub fn answer<K: kube::Resource>(
    request: &AdmissionRequest<K>,
    refusal: Option<&Refusal>,
) -> AdmissionReview<DynamicObject> {
    let response = AdmissionResponse::from(request);
    match refusal {
        None => response.into_review(),
        Some(r) => {
            let mut response = response.deny(r.message());
            response.result.code = r.code.http_status();
            response.result.reason = r.code.as_str().to_owned();
            response.into_review()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangar_crds::{Command, ErrorCode};
    use serde_json::json;

    fn request() -> AdmissionRequest<Command> {
        let review: AdmissionReview<Command> = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "abc", "operation": "CREATE", "userInfo": {}, "name": "c", "namespace": "ns",
                "kind": {"group": "hangar.dev", "version": "v1alpha1", "kind": "Command"},
                "resource": {"group": "hangar.dev", "version": "v1alpha1", "resource": "commands"},
                "object": {"apiVersion": "hangar.dev/v1alpha1", "kind": "Command", "metadata": {"name": "c"},
                           "spec": {"sandbox": "box", "argv": ["true"]}},
            }
        }))
        .unwrap();
        review.try_into().unwrap()
    }

    #[test]
    fn a_refusal_carries_the_code_first_and_its_http_status() {
        let r = Refusal::new(ErrorCode::SandboxCommandLimit, "a session takes at most 247 commands");
        let v = serde_json::to_value(answer(&request(), Some(&r))).unwrap();
        assert_eq!(v["response"]["uid"], "abc");
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"]["code"], 409);
        assert_eq!(v["response"]["status"]["reason"], "sandbox_command_limit");
        assert_eq!(v["response"]["status"]["message"], "sandbox_command_limit: a session takes at most 247 commands");
        let allowed = serde_json::to_value(answer(&request(), None)).unwrap();
        assert_eq!(allowed["response"]["allowed"], true);
        assert_eq!(allowed["apiVersion"], "admission.k8s.io/v1");
    }
}
