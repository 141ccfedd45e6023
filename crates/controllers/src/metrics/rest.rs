//! client-go's REST client metrics for every request a kube client of the process makes, as the reference registers
//! them: `rest_client_requests_total{code,method,host}` and `rest_client_request_latency_seconds{verb,url}` (a
//! histogram, buckets 1 ms ×2 ×10), `url` being the request's URL template — names and namespaces replaced by
//! `{name}` and `{namespace}`, query values by `{value}` — so that its cardinality stays bounded. A tower layer on
//! the client's service stack ([`RestMetricsLayer`]); one set of families per process, as client-go's.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, LazyLock},
    task::{Context, Poll},
    time::Instant,
};

use http::{Method, Request, Response};
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder},
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

/// The result of a request as client-go labels it: the HTTP status code, or `<error>` when no response came.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Code {
    Status(u16),
    Error,
}

impl EncodeLabelValue for Code {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        match self {
            Self::Status(code) => EncodeLabelValue::encode(code, encoder),
            Self::Error => EncodeLabelValue::encode(&"<error>", encoder),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    code: Code,
    method: &'static str,
    host: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    verb: &'static str,
    url: String,
}

/// The REST client families of the process.
#[derive(Debug)]
pub struct RestMetrics {
    requests: Family<ResultLabels, Counter>,
    latency: Family<LatencyLabels, Histogram>,
}

impl RestMetrics {
    /// The process's families, served by every `/metrics` of the process.
    pub fn global() -> &'static Self {
        static GLOBAL: LazyLock<RestMetrics> = LazyLock::new(|| RestMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(|| {
                // The reference's buckets: prometheus.ExponentialBuckets(0.001, 2, 10).
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.001, 2.0, 10,
                ))
            }),
        });
        &GLOBAL
    }
}

pub(super) fn register(registry: &mut Registry, metrics: &RestMetrics) {
    registry.register(
        "rest_client_requests",
        "Number of HTTP requests, partitioned by status code, method, and host",
        metrics.requests.clone(),
    );
    registry.register(
        "rest_client_request_latency_seconds",
        "Request latency in seconds. Broken down by verb and URL",
        metrics.latency.clone(),
    );
}

/// The method as a label value (client-go's verb is the HTTP method).
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

/// The URL template client-go labels a request's latency with: `base` (scheme and host, as the client's server
/// URL) and the path of `path_and_query` with the object's namespace and name replaced by `{namespace}` and `{name}`
/// (percent-encoded, as Go prints a URL), every query value by `{value}`, the keys sorted; a path outside `/api` and
/// `/apis` is `/{prefix}`.
pub fn url_template(base: &str, path_and_query: &str) -> String {
    const NAME: &str = "%7Bname%7D";
    const NAMESPACE: &str = "%7Bnamespace%7D";
    let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
    let mut segments: Vec<&str> = path.split('/').collect();
    let mut out = String::with_capacity(base.len() + path_and_query.len() + 16);
    out.push_str(base.trim_end_matches('/'));
    if segments.len() > 2 {
        // ["", "api", version, rest...] or ["", "apis", group, version, rest...]: `index` is the first segment
        // after the version.
        let index = match segments[1] {
            "api" => 3,
            "apis" => 4,
            _ => {
                out.push_str("/%7Bprefix%7D");
                return out;
            }
        };
        let after = segments.len().saturating_sub(index);
        let not_subresource = |segment: &str| segment != "finalize" && segment != "status";
        match after {
            2 => segments[index + 1] = NAME,
            3 if !not_subresource(segments[index + 2]) => segments[index + 1] = NAME,
            3 => segments[index + 1] = NAMESPACE,
            n if n >= 4 => {
                segments[index + 1] = NAMESPACE;
                if not_subresource(segments[index + 3]) {
                    segments[index + 3] = NAME;
                }
            }
            _ => {}
        }
    }
    out.push_str(&segments.join("/"));
    let mut keys: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').map_or(pair, |(key, _)| key))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    for (i, key) in keys.iter().enumerate() {
        out.push(if i == 0 { '?' } else { '&' });
        out.push_str(key);
        out.push_str("=%7Bvalue%7D");
    }
    out
}

/// Whether a request is a watch: client-go observes no latency for watches (their response lasts as long as the
/// watch).
fn is_watch(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|pair| pair == "watch=true" || pair == "watch=1"))
}

/// The tower layer that counts and times the requests of a kube client (`ClientBuilder::with_layer`, outermost, so
/// that the client-side rate limit's wait is part of the latency, as in client-go).
#[derive(Clone, Debug)]
pub struct RestMetricsLayer {
    host: Arc<str>,
    base: Arc<str>,
    metrics: &'static RestMetrics,
}

impl RestMetricsLayer {
    /// The layer for a client of the server at `cluster_url` (its `host` label and the base of its URL templates).
    pub fn new(cluster_url: &http::Uri) -> Self {
        let host = cluster_url
            .authority()
            .map_or("none", http::uri::Authority::as_str);
        let scheme = cluster_url.scheme_str().unwrap_or("https");
        let path = cluster_url.path().trim_end_matches('/');
        Self {
            host: host.into(),
            base: format!("{scheme}://{host}{path}").into(),
            metrics: RestMetrics::global(),
        }
    }
}

impl<S> tower::Layer<S> for RestMetricsLayer {
    type Service = RestMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RestMetricsService {
            inner,
            layer: self.clone(),
        }
    }
}

/// A service counted and timed by [`RestMetricsLayer`].
#[derive(Clone, Debug)]
pub struct RestMetricsService<S> {
    inner: S,
    layer: RestMetricsLayer,
}

impl<S, B, RB> tower::Service<Request<B>> for RestMetricsService<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Unpin,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = RestMetricsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let method = method_label(request.method());
        let uri = request.uri();
        let latency = (!is_watch(uri.query())).then(|| {
            let path_and_query = uri.path_and_query().map_or("/", http::uri::PathAndQuery::as_str);
            self.layer.metrics.latency.get_or_create_owned(&LatencyLabels {
                verb: method,
                url: url_template(&self.layer.base, path_and_query),
            })
        });
        RestMetricsFuture {
            inner: self.inner.call(request),
            started: Instant::now(),
            method,
            latency,
            layer: self.layer.clone(),
        }
    }
}

/// The response future of [`RestMetricsService`]: records the request when the response (or the error) comes.
pub struct RestMetricsFuture<F> {
    inner: F,
    started: Instant,
    method: &'static str,
    latency: Option<Histogram>,
    layer: RestMetricsLayer,
}

impl<F, RB, E> Future for RestMetricsFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>> + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let result = std::task::ready!(Pin::new(&mut this.inner).poll(cx));
        let code = match &result {
            Ok(response) => Code::Status(response.status().as_u16()),
            Err(_) => Code::Error,
        };
        this.layer
            .metrics
            .requests
            .get_or_create(&ResultLabels {
                code,
                method: this.method,
                host: this.layer.host.clone(),
            })
            .inc();
        if let Some(latency) = this.latency.take() {
            latency.observe(this.started.elapsed().as_secs_f64());
        }
        Poll::Ready(result)
    }
}

#[cfg(test)]
mod tests {
    use tower::{Layer as _, Service as _, ServiceExt as _};

    use super::{RestMetricsLayer, url_template};

    const BASE: &str = "https://127.0.0.1:6443";

    #[test]
    fn names_namespaces_and_query_values_are_templated_as_client_go_does() {
        for (path, template) in [
            (
                "/apis/machine.sapcloud.io/v1alpha1/namespaces/shoot--a/machines/m-1",
                "/apis/machine.sapcloud.io/v1alpha1/namespaces/%7Bnamespace%7D/machines/%7Bname%7D",
            ),
            (
                "/apis/machine.sapcloud.io/v1alpha1/namespaces/shoot--a/machines/m-1/status",
                "/apis/machine.sapcloud.io/v1alpha1/namespaces/%7Bnamespace%7D/machines/%7Bname%7D/status",
            ),
            (
                "/apis/machine.sapcloud.io/v1alpha1/namespaces/shoot--a/machines?limit=500&labelSelector=a%3Db",
                "/apis/machine.sapcloud.io/v1alpha1/namespaces/%7Bnamespace%7D/machines?labelSelector=%7Bvalue%7D\
                 &limit=%7Bvalue%7D",
            ),
            ("/api/v1/nodes/node-1", "/api/v1/nodes/%7Bname%7D"),
            ("/api/v1/nodes/node-1/status", "/api/v1/nodes/%7Bname%7D/status"),
            ("/api/v1/nodes", "/api/v1/nodes"),
            (
                "/api/v1/namespaces/ns/pods/p/eviction",
                "/api/v1/namespaces/%7Bnamespace%7D/pods/%7Bname%7D/eviction",
            ),
            (
                "/api/v1/namespaces/ns/finalize",
                "/api/v1/namespaces/%7Bname%7D/finalize",
            ),
            ("/apis/coordination.k8s.io/v1", "/apis/coordination.k8s.io/v1"),
            ("/version", "/version"),
            ("/healthz/etcd?verbose=1", "/%7Bprefix%7D"),
        ] {
            assert_eq!(url_template(BASE, path), format!("{BASE}{template}"), "{path}");
        }
    }

    #[tokio::test]
    async fn every_request_is_counted_by_code_method_and_host_and_timed_by_template() {
        // A host of its own: the families are the process's, other tests count into them too.
        let layer = RestMetricsLayer::new(&"https://rest-layer-test.invalid:6443".parse().unwrap());
        let mut service = layer.layer(tower::service_fn(|request: http::Request<()>| {
            let status = if request.uri().path().ends_with("/gone") {
                404
            } else {
                200
            };
            // An Unpin future, as the kube client's (boxed) futures are.
            std::future::ready(Ok::<_, std::convert::Infallible>(
                http::Response::builder().status(status).body(()).unwrap(),
            ))
        }));
        for (method, uri) in [
            (http::Method::GET, "/api/v1/namespaces/ns/pods/gone"),
            (http::Method::GET, "/api/v1/namespaces/ns/pods/p-1"),
            (http::Method::GET, "/api/v1/namespaces/ns/pods/p-2"),
            (
                http::Method::GET,
                "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=7",
            ),
            (http::Method::DELETE, "/api/v1/namespaces/ns/pods/p-1"),
        ] {
            let request = http::Request::builder().method(method).uri(uri).body(()).unwrap();
            service.ready().await.unwrap().call(request).await.unwrap();
        }
        let mut registry = prometheus_client::registry::Registry::default();
        super::register(&mut registry, super::RestMetrics::global());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let host = r#"host="rest-layer-test.invalid:6443""#;
        for expected in [
            format!(r#"rest_client_requests_total{{code="404",method="GET",{host}}} 1"#),
            format!(r#"rest_client_requests_total{{code="200",method="GET",{host}}} 3"#),
            format!(r#"rest_client_requests_total{{code="200",method="DELETE",{host}}} 1"#),
            // Two names, one template; the watch is not timed (as client-go).
            r#"rest_client_request_latency_seconds_count{verb="GET",url="https://rest-layer-test.invalid:6443/api/v1/namespaces/%7Bnamespace%7D/pods/%7Bname%7D"} 3"#.to_owned(),
        ] {
            assert!(text.contains(&expected), "{expected}\n{text}");
        }
        assert!(
            !text.contains("rest-layer-test.invalid:6443/api/v1/namespaces/%7Bnamespace%7D/pods?"),
            "{text}"
        );
    }
}
