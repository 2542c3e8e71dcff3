//! Certificates for the local control plane: one CA, the apiserver's serving
//! certificate (127.0.0.1 and localhost), an admin client certificate in
//! `system:masters`, the service-account signing key, and the apiserver's
//! client certificate for the admission webhook (under a CA of its own).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use crate::error::{Result, io};

pub struct Pki {
    /// The cluster CA itself, to issue more clients (a kubelet's
    /// `system:node:<name>`, the controllers').
    pub ca: LocalCa,
    pub ca_cert: PathBuf,
    pub ca_pem: String,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
    pub service_account_key: PathBuf,
    pub service_account_pub: PathBuf,
    /// A CA of its own for the one client the admission webhook accepts:
    /// the apiserver, which presents `admission_client_*` (nothing else
    /// this CA could have issued exists).
    pub admission_client_ca: PathBuf,
    pub admission_client_cert: PathBuf,
    pub admission_client_key: PathBuf,
}

/// A certificate and key issued by a CA, in PEM.
pub struct IssuedPem {
    pub cert: String,
    pub key: String,
}

/// A local certificate authority that can issue serving certificates (the
/// webhook and gateway use this too).
pub struct LocalCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl LocalCa {
    pub fn new(common_name: &str) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        Ok(Self { issuer: CertifiedIssuer::self_signed(params, KeyPair::generate()?)? })
    }

    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn serving(&self, common_name: &str, names: &[&str]) -> Result<IssuedPem> {
        let mut params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        self.issue(params)
    }

    /// A client certificate: CN is the user name, each O a group.
    pub fn client(&self, user: &str, groups: &[&str]) -> Result<IssuedPem> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.issue(params)
    }

    fn issue(&self, params: CertificateParams) -> Result<IssuedPem> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedPem { cert: cert.pem(), key: key.serialize_pem() })
    }
}

fn write(dir: &Path, name: &str, body: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, body).map_err(io(format!("write {}", path.display())))?;
    Ok(path)
}

impl Pki {
    pub fn generate(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io("create pki dir"))?;
        let ca = LocalCa::new("hangar-local-ca")?;
        let serving = ca.serving("kube-apiserver", &["127.0.0.1", "localhost"])?;
        let admin = ca.client("hangar-admin", &["system:masters"])?;
        let sa = KeyPair::generate()?;
        let ca_pem = ca.cert_pem();
        let admission_ca = LocalCa::new("hangar-admission-clients")?;
        let admission_client = admission_ca.client("kube-apiserver-admission", &[])?;
        Ok(Self {
            admission_client_ca: write(dir, "admission-client-ca.crt", &admission_ca.cert_pem())?,
            admission_client_cert: write(dir, "admission-client.crt", &admission_client.cert)?,
            admission_client_key: write(dir, "admission-client.key", &admission_client.key)?,
            ca_cert: write(dir, "ca.crt", &ca_pem)?,
            ca_pem,
            serving_cert: write(dir, "apiserver.crt", &serving.cert)?,
            serving_key: write(dir, "apiserver.key", &serving.key)?,
            admin_cert_pem: admin.cert,
            admin_key_pem: admin.key,
            service_account_key: write(dir, "sa.key", &sa.serialize_pem())?,
            service_account_pub: write(dir, "sa.pub", &sa.public_key_pem())?,
            ca,
        })
    }
}
