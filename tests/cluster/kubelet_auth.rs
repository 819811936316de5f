//! The kubelet server's authentication and authorization (`rustlet-server`'s `KubeletAuth`)
//! against the real API server, with the node's own credentials: bearer tokens through a
//! `TokenReview`, the verb and `nodes` subresources through `SubjectAccessReview`s that RBAC
//! answers, and the API server's kubelet client certificate through x509 against the
//! cluster's CA. The node may create both reviews (the Node authorizer's static rules): the
//! audit log shows no refusal of `system:node:node-a`.

use http::{HeaderMap, HeaderValue, Method};
use rustlet_server::auth::{
    AuthSettings, Credentials, KubeletAuth, KubeletAuthentication, KubeletAuthorization, Refusal,
    Reviewers, X509Authentication,
};

use crate::support::cluster;

fn bearer(token: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    headers
}

#[test]
fn kubelet_auth_reviews_tokens_and_access_through_the_real_api_server() {
    let Some(cluster) = cluster("kubelet-auth", &["node-a"], |_| {}) else {
        return;
    };
    cluster.kubectl(&["create", "namespace", "auth"]);
    for sa in ["nobody", "viewer"] {
        cluster.kubectl(&["-n", "auth", "create", "serviceaccount", sa]);
    }
    cluster.kubectl(&[
        "create",
        "clusterrole",
        "node-pods-reader",
        "--verb=get",
        "--resource=nodes/pods",
    ]);
    cluster.kubectl(&[
        "create",
        "clusterrolebinding",
        "viewer-node-pods",
        "--clusterrole=node-pods-reader",
        "--serviceaccount=auth:viewer",
    ]);
    // RBAC's informers see the binding a moment later; a refusal would be cached for 30 s.
    cluster.wait_for("the viewer may get nodes/pods", || {
        let out = cluster.kubectl_output(
            &[
                "auth",
                "can-i",
                "get",
                "nodes",
                "--subresource=pods",
                "--as=system:serviceaccount:auth:viewer",
            ],
            None,
        );
        let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (said == "yes").then_some(()).ok_or(said)
    });
    let token = |sa: &str| {
        cluster
            .kubectl(&["-n", "auth", "create", "token", sa])
            .trim()
            .to_owned()
    };
    let (nobody, viewer) = (token("nobody"), token("viewer"));
    let apiserver_client = rustlet_server::tls::read_certificates(
        "the API server's kubelet client certificate",
        &cluster.inner.pki("apiserver-kubelet-client.crt"),
    )
    .unwrap();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(cluster.inner.node_kubeconfig("node-a")).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let auth = KubeletAuth::new(AuthSettings {
            node_name: "node-a".to_owned(),
            authentication: KubeletAuthentication {
                x509: X509Authentication {
                    client_ca_file: Some(cluster.inner.pki("ca.crt")),
                },
                ..KubeletAuthentication::default()
            },
            authorization: KubeletAuthorization::default(),
            reviewers: Reviewers::kube(client),
        })
        .unwrap();
        let none = HeaderMap::new();
        let with_token = |headers| Credentials {
            headers,
            peer_certificates: &[],
        };

        let viewer_headers = bearer(&viewer);
        let admitted = auth
            .check(&Method::GET, "/pods", with_token(&viewer_headers))
            .await
            .unwrap();
        assert_eq!(admitted.user.name, "system:serviceaccount:auth:viewer");
        assert!(
            admitted
                .user
                .groups
                .contains(&"system:serviceaccounts:auth".to_owned()),
            "{:?}",
            admitted.user.groups
        );
        assert_eq!(
            auth.check(&Method::POST, "/exec/auth/p/c", with_token(&viewer_headers))
                .await
                .unwrap_err(),
            Refusal::Forbidden {
                user: "system:serviceaccount:auth:viewer".to_owned(),
                verb: "create",
                subresources: vec!["proxy"],
            }
        );

        let nobody_headers = bearer(&nobody);
        let refusal = auth
            .check(&Method::GET, "/pods", with_token(&nobody_headers))
            .await
            .unwrap_err();
        assert_eq!(
            refusal.body(),
            "Forbidden (user=system:serviceaccount:auth:nobody, verb=get, resource=nodes, \
             subresource(s)=[pods proxy])\n"
        );

        let forged = bearer("not-a-token");
        assert_eq!(
            auth.check(&Method::GET, "/pods", with_token(&forged))
                .await
                .unwrap_err(),
            Refusal::Unauthorized
        );
        assert_eq!(
            auth.check(&Method::GET, "/pods", with_token(&none))
                .await
                .unwrap_err(),
            Refusal::Unauthorized
        );

        // The API server's own client certificate (system:masters): x509 against the CA, then
        // a review RBAC allows.
        let admitted = auth
            .check(
                &Method::POST,
                "/exec/auth/p/c",
                Credentials {
                    headers: &none,
                    peer_certificates: &apiserver_client,
                },
            )
            .await
            .unwrap();
        assert_eq!(admitted.user.name, "kube-apiserver-kubelet-client");
    });

    assert_eq!(
        cluster.refused_requests_of_node("node-a"),
        Vec::<String>::new()
    );
}
