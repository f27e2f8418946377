//! A layer of the API client that keeps one object from failing a whole list page or watch
//! stream: an object nested deeper than [`MAX_DEPTH`], or larger than [`MAX_OBJECT_BYTES`],
//! reaches the program as a small stub (its apiVersion, kind, name, namespace, uid and
//! resourceVersion) carrying the field [`UNREADABLE_FIELD`] that says why ([`unreadable`]).
//!
//! kube-rs parses each list page, and each watch event, whole with `serde_json`, whose
//! recursion limit is 128, before any per-object decode sees an item; the API server accepts
//! objects far deeper than that under `x-kubernetes-preserve-unknown-fields`. One tenant's
//! 200-deep WorkspaceTemplate made every list of its kind fail, after each restart, forever:
//! the caches never synced and no tenant was reconciled.
//!
//! The layer scans the bytes of a list page or a watch stream as they arrive, without
//! parsing and without recursion: it counts brackets outside strings, and reads the few
//! strings of an object's top two levels that name it (`metadata.managedFields` mirror the
//! object's depth, so metadata is never parsed whole). A list page is handed on whole once
//! scanned (kube-rs collects it whole anyway); a watch stream is handed on event by event,
//! one object held at a time. An object keeps at most [`MAX_OBJECT_BYTES`] of its text in
//! the layer; beyond that only its name is kept, so a page of the largest objects the API
//! server stores (1.5 MiB each) costs a page of stubs.

use axum::body::Bytes;
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, StreamBody};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower::{BoxError, Layer, Service};

/// The deepest nesting of an object (the object itself counts 1) that is handed on whole.
/// `serde_json` stops at 128 levels, and a list page wraps an object in two more (the list
/// and its `items`); the programs' own types are never deeper than about 10.
pub const MAX_DEPTH: usize = 100;

/// The largest object (its JSON text) that is handed on whole: twice the largest
/// WorkspaceTemplate spec the controller renders (256 KiB), so that every Workspace rendered
/// from one stays readable. A list page of 50 such objects is 25 MiB of text, which kube-rs
/// holds twice while it parses the page (docs/operating.md, "An object nobody can read").
pub const MAX_OBJECT_BYTES: usize = 512 * 1024;

/// The field of a stub that says why its object was not handed on (a JSON object with a
/// `message`, and `bytes` or `depth`). The API server prunes unknown top-level fields, so no
/// object written to it carries this one.
pub const UNREADABLE_FIELD: &str = "x-capt-unreadable";

/// Why an object reached the program as a stub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stubbed {
    /// What was wrong with it, in words (`nested 200 levels deep, over the limit of 100`).
    pub message: String,
    /// Its size in bytes, when it was too large.
    pub bytes: Option<u64>,
}

/// Why the object `value` (as JSON, at its top level: an object, or a `DynamicObject`'s
/// data) reached the program as a stub, or `None` when it is the object itself.
pub fn unreadable(value: &serde_json::Value) -> Option<Stubbed> {
    let marker = value.get(UNREADABLE_FIELD)?;
    Some(Stubbed {
        message: marker
            .get("message")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("unreadable")
            .to_owned(),
        bytes: marker.get("bytes").and_then(serde_json::Value::as_u64),
    })
}

/// The layer ([`kube::client::ClientBuilder::with_layer`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct GuardLayer;

impl<S> Layer<S> for GuardLayer {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        Guard { inner }
    }
}

/// The service of [`GuardLayer`].
#[derive(Clone, Debug)]
pub struct Guard<S> {
    inner: S,
}

/// The body the guarded client hands on.
pub type GuardedBody = UnsyncBoxBody<Bytes, BoxError>;

type Request = axum::http::Request<kube::client::Body>;

impl<S, B> Service<Request> for Guard<S>
where
    S: Service<Request, Response = axum::http::Response<B>>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = axum::http::Response<GuardedBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let shape = Shape::of(&request);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            let shape = shape.filter(|_| response.status().is_success());
            Ok(response.map(|body| match shape {
                Some(shape) => guarded(body, shape),
                None => body.map_err(Into::into).boxed_unsync(),
            }))
        })
    }
}

/// What a response holds objects as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// A list (a GET): the elements of its top-level `items`. A GET of one object has no
    /// `items` and passes unchanged.
    List,
    /// A watch stream: the `object` of each event.
    Watch,
}

impl Shape {
    fn of(request: &Request) -> Option<Self> {
        if request.method() != axum::http::Method::GET {
            return None;
        }
        let watch = request
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1");
        Some(match watch {
            true => Self::Watch,
            false => Self::List,
        })
    }

    /// The nesting depth of an object once its opening brace is read: the list, its
    /// `items` and the object; or the event and the object.
    fn depth(self) -> usize {
        match self {
            Self::List => 3,
            Self::Watch => 2,
        }
    }
}

fn guarded<B>(body: B, shape: Shape) -> GuardedBody
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let state = (Box::pin(body), Scanner::new(shape), false);
    let frames = futures::stream::unfold(state, move |(mut body, mut scanner, done)| async move {
        if done {
            return None;
        }
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        scanner.push(&data);
                    }
                    // A watch hands each event on as soon as it is whole; a list page once
                    // it is (kube-rs collects it whole: one buffer is not copied again).
                    if shape == Shape::Watch && !scanner.out.is_empty() {
                        let out = Bytes::from(std::mem::take(&mut scanner.out));
                        return Some((Ok(Frame::data(out)), (body, scanner, false)));
                    }
                }
                Some(Err(error)) => return Some((Err(error.into()), (body, scanner, true))),
                None => {
                    let out = scanner.finish();
                    if out.is_empty() {
                        return None;
                    }
                    return Some((Ok(Frame::data(Bytes::from(out))), (body, scanner, true)));
                }
            }
        }
    });
    StreamBody::new(frames).boxed_unsync()
}

/// How many levels of nesting keep what they are (an object or an array) and their current
/// key: enough for a list, its items and their metadata.
const SHALLOW: usize = 6;
/// The longest key or naming string kept (a name is at most 253 bytes; escapes lengthen it).
const MAX_CAPTURE: usize = 1024;

/// The scan of one response body: what is handed on, and the object being read.
struct Scanner {
    shape: Shape,
    /// What is handed on.
    out: Vec<u8>,
    /// Containers open.
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// Per shallow level: an object (not an array), a key expected next, and its last key.
    object: [bool; SHALLOW],
    expect_key: [bool; SHALLOW],
    keys: [Vec<u8>; SHALLOW],
    /// The text of the current string, when it is shallow enough to matter.
    capture: Option<Vec<u8>>,
    /// The object being read, if one is.
    item: Option<Item>,
}

/// One object being read.
#[derive(Default)]
struct Item {
    /// Its text so far, while it is small and shallow enough to be handed on.
    text: Vec<u8>,
    /// Its text is no longer kept.
    dropped: bool,
    bytes: usize,
    depth: usize,
    /// apiVersion, kind, name, namespace, uid, resourceVersion (as escaped JSON text).
    names: [Option<Vec<u8>>; 6],
}

const NAMED: [&str; 6] = [
    "apiVersion",
    "kind",
    "name",
    "namespace",
    "uid",
    "resourceVersion",
];

impl Scanner {
    fn new(shape: Shape) -> Self {
        Self {
            shape,
            out: Vec::new(),
            depth: 0,
            in_string: false,
            escaped: false,
            object: [false; SHALLOW],
            expect_key: [false; SHALLOW],
            keys: Default::default(),
            capture: None,
            item: None,
        }
    }

    /// Scans the next bytes of the body.
    fn push(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            if self.in_string && !self.escaped && self.capture.is_none() {
                // The bulk of a body is strings no one reads: skip to their end.
                let end = memchr::memchr2(b'"', b'\\', chunk).unwrap_or(chunk.len());
                self.record(&chunk[..end]);
                chunk = &chunk[end..];
                if chunk.is_empty() {
                    break;
                }
            }
            self.byte(chunk[0]);
            chunk = &chunk[1..];
        }
    }

    /// The rest of what is handed on, at the end of the body. A body cut short inside an
    /// object is handed on as it came (the client then fails to parse it, as it would have).
    fn finish(&mut self) -> Vec<u8> {
        if let Some(item) = self.item.take()
            && !item.dropped
        {
            self.out.extend_from_slice(&item.text);
        }
        std::mem::take(&mut self.out)
    }

    fn record(&mut self, bytes: &[u8]) {
        let Some(item) = self.item.as_mut() else {
            self.out.extend_from_slice(bytes);
            return;
        };
        item.bytes += bytes.len();
        if item.dropped {
            return;
        }
        if item.bytes > MAX_OBJECT_BYTES {
            item.dropped = true;
            item.text = Vec::new();
        } else {
            item.text.extend_from_slice(bytes);
        }
    }

    fn byte(&mut self, b: u8) {
        if self.in_string {
            self.record(&[b]);
            let closing = !self.escaped && b == b'"';
            if !closing
                && let Some(capture) = self.capture.as_mut()
                && capture.len() <= MAX_CAPTURE
            {
                capture.push(b);
            }
            self.escaped = !self.escaped && b == b'\\';
            if closing {
                self.in_string = false;
                self.string_ended();
            }
            return;
        }
        if b == b'{' && self.item.is_none() && self.object_starts() {
            self.item = Some(Item::default());
        }
        self.record(&[b]);
        let d = self.depth;
        match b {
            b'"' => {
                self.in_string = true;
                self.capture = (d < SHALLOW).then(Vec::new);
            }
            b'{' | b'[' => {
                self.depth += 1;
                let d = self.depth;
                if d < SHALLOW {
                    self.object[d] = b == b'{';
                    self.expect_key[d] = b == b'{';
                    self.keys[d].clear();
                }
                let base = self.shape.depth();
                if let Some(item) = self.item.as_mut() {
                    item.depth = item.depth.max(d + 1 - base);
                    if item.depth > MAX_DEPTH && !item.dropped {
                        item.dropped = true;
                        item.text = Vec::new();
                    }
                }
            }
            b'}' | b']' => {
                self.depth = d.saturating_sub(1);
                if self.item.is_some() && self.depth + 1 == self.shape.depth() {
                    self.object_ended();
                }
            }
            b',' if d < SHALLOW && self.object[d] => self.expect_key[d] = true,
            _ => {}
        }
    }

    /// Whether a `{` read now opens an object to guard.
    fn object_starts(&self) -> bool {
        match self.shape {
            Shape::List => {
                self.depth == 2 && self.object[1] && !self.object[2] && self.keys[1] == b"items"
            }
            _ => self.depth == 1 && self.object[1] && self.keys[1] == b"object",
        }
    }

    fn string_ended(&mut self) {
        let Some(text) = self.capture.take() else {
            return;
        };
        if text.len() > MAX_CAPTURE {
            return;
        }
        let d = self.depth;
        if self.object[d] && self.expect_key[d] {
            self.expect_key[d] = false;
            self.keys[d] = text;
            return;
        }
        let base = self.shape.depth();
        // A string of the object itself, or of its metadata.
        if d != base && (d != base + 1 || self.keys[base] != b"metadata") {
            return;
        }
        let field = &self.keys[d][..];
        let Some(at) = NAMED.iter().position(|n| n.as_bytes() == field) else {
            return;
        };
        // apiVersion and kind are the object's own; the others its metadata's.
        if (at < 2) != (d == base) {
            return;
        }
        if let Some(item) = self.item.as_mut() {
            item.names[at] = Some(text);
        }
    }

    fn object_ended(&mut self) {
        let Some(item) = self.item.take() else {
            return;
        };
        let why = if item.depth > MAX_DEPTH {
            (
                format!(
                    "nested {} levels deep, over the limit of {MAX_DEPTH}",
                    item.depth
                ),
                "depth",
                item.depth,
            )
        } else if item.bytes > MAX_OBJECT_BYTES {
            (
                format!("{} bytes, over the limit of {MAX_OBJECT_BYTES}", item.bytes),
                "bytes",
                item.bytes,
            )
        } else {
            self.out.extend_from_slice(&item.text);
            return;
        };
        stub(&mut self.out, &item.names, why);
    }
}

/// Writes the stub of an object named by `names` (escaped JSON text, as read), with why.
fn stub(
    out: &mut Vec<u8>,
    names: &[Option<Vec<u8>>; 6],
    (message, unit, n): (String, &str, usize),
) {
    let field = |out: &mut Vec<u8>, key: &str, value: &[u8]| {
        out.extend_from_slice(format!("\"{key}\":\"").as_bytes());
        out.extend_from_slice(value);
        out.push(b'"');
    };
    out.push(b'{');
    for (key, value) in NAMED.iter().zip(names).take(2) {
        if let Some(value) = value {
            field(out, key, value);
            out.push(b',');
        }
    }
    out.extend_from_slice(b"\"metadata\":{");
    let mut first = true;
    for (key, value) in NAMED.iter().zip(names).skip(2) {
        if let Some(value) = value {
            if !first {
                out.push(b',');
            }
            field(out, key, value);
            first = false;
        }
    }
    let marker = serde_json::json!({"message": message, unit: n});
    out.extend_from_slice(format!("}},\"{UNREADABLE_FIELD}\":{marker}}}").as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A value nested `depth` levels deep (the outermost counts 1).
    fn nested(depth: usize) -> Value {
        let mut v = json!("bottom");
        for _ in 0..depth {
            v = json!({ "a": v });
        }
        v
    }

    /// The text of `value` (no recursion: `serde_json` would stop at 128 levels).
    fn deep_text(depth: usize) -> String {
        format!("{}\"bottom\"{}", "{\"a\":".repeat(depth), "}".repeat(depth))
    }

    fn object(name: &str, spec: &str) -> String {
        format!(
            r#"{{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta1","kind":"WorkspaceTemplate","metadata":{{"labels":{{"name":"decoy","uid":"decoy"}},"managedFields":[{{"fieldsV1":{spec},"manager":"m"}}],"name":"{name}","namespace":"mallory","resourceVersion":"42","uid":"u-{name}"}},"spec":{spec}}}"#
        )
    }

    fn scan(shape: Shape, text: &[u8], chunk: usize) -> Vec<u8> {
        let mut scanner = Scanner::new(shape);
        let mut out = Vec::new();
        for piece in text.chunks(chunk) {
            scanner.push(piece);
            out.append(&mut scanner.out);
        }
        out.extend(scanner.finish());
        out
    }

    #[test]
    fn a_list_page_keeps_every_object_and_stubs_the_one_nested_too_deep() {
        let page = format!(
            r#"{{"apiVersion":"v1","items":[{},{},{}],"kind":"List","metadata":{{"resourceVersion":"9"}}}}"#,
            object("a", r#"{"s":"[{\"quoted\"}] ]]"}"#),
            object("deep", &deep_text(200)),
            // Its managedFields are its deepest: four levels, then the spec's.
            object("b", &nested(MAX_DEPTH - 4).to_string()),
        );
        // However the body is cut into chunks, the same page is handed on.
        let whole = scan(Shape::List, page.as_bytes(), page.len());
        for chunk in [1, 2, 3, 7, 64, 1000] {
            assert_eq!(scan(Shape::List, page.as_bytes(), chunk), whole, "{chunk}");
        }
        let list: Value = serde_json::from_slice(&whole).expect("the page parses");
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(
            items[0],
            serde_json::from_str::<Value>(&object("a", r#"{"s":"[{\"quoted\"}] ]]"}"#)).unwrap()
        );
        assert_eq!(
            items[2]["spec"],
            nested(MAX_DEPTH - 4),
            "at the limit: whole"
        );
        assert_eq!(
            items[1],
            json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                "kind": "WorkspaceTemplate",
                "metadata": {"name": "deep", "namespace": "mallory", "resourceVersion": "42",
                    "uid": "u-deep"},
                UNREADABLE_FIELD: {"message": "nested 204 levels deep, over the limit of 100",
                    "depth": 204}}),
        );
        let why = unreadable(&items[1]).expect("marked");
        assert_eq!(why.bytes, None);
        assert_eq!(unreadable(&items[0]), None);
        assert_eq!(list["metadata"]["resourceVersion"], "9");
    }

    #[test]
    fn an_object_over_the_size_limit_is_stubbed_with_its_size() {
        let large = object("large", &format!("\"{}\"", "x".repeat(MAX_OBJECT_BYTES)));
        let page = format!(r#"{{"items":[{large}],"kind":"List","metadata":{{}}}}"#);
        let out = scan(Shape::List, page.as_bytes(), 16 * 1024);
        let list: Value = serde_json::from_slice(&out).unwrap();
        let why = unreadable(&list["items"][0]).expect("marked");
        assert_eq!(why.bytes, Some(large.len() as u64));
        assert_eq!(
            why.message,
            format!(
                "{} bytes, over the limit of {MAX_OBJECT_BYTES}",
                large.len()
            )
        );
        assert_eq!(list["items"][0]["metadata"]["name"], "large");
    }

    #[test]
    fn a_watch_stream_hands_each_event_on_and_stubs_its_object_alone() {
        let stream = format!(
            "{}\n{}\n{}\n",
            format_args!(r#"{{"type":"ADDED","object":{}}}"#, object("a", "{}")),
            format_args!(
                r#"{{"type":"MODIFIED","object":{}}}"#,
                object("deep", &deep_text(1_000_000))
            ),
            r#"{"type":"BOOKMARK","object":{"kind":"WorkspaceTemplate","metadata":{"resourceVersion":"50"}}}"#,
        );
        let out = scan(Shape::Watch, stream.as_bytes(), 4096);
        let events: Vec<Value> = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).expect("each event parses"))
            .collect();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0]["object"]["metadata"]["name"], "a");
        assert_eq!(events[1]["type"], "MODIFIED");
        assert_eq!(events[1]["object"]["metadata"]["uid"], "u-deep");
        assert_eq!(
            unreadable(&events[1]["object"]).unwrap().message,
            "nested 1000004 levels deep, over the limit of 100"
        );
        assert_eq!(events[2]["object"]["metadata"]["resourceVersion"], "50");
        // The first event is handed on before the second is read whole.
        let mut scanner = Scanner::new(Shape::Watch);
        scanner.push(&stream.as_bytes()[..stream.find("MODIFIED").unwrap()]);
        assert!(scanner.out.starts_with(br#"{"type":"ADDED""#));
    }

    #[test]
    fn a_single_object_and_what_is_not_json_pass_unchanged() {
        let one = object("deep", &deep_text(3));
        assert_eq!(scan(Shape::List, one.as_bytes(), 5), one.as_bytes());
        let text = b"not json { [ \" \\";
        assert_eq!(scan(Shape::List, text, 3), text);
    }

    #[test]
    fn only_a_watch_request_is_read_as_a_stream() {
        let request = |method: &str, uri: &str| {
            axum::http::Request::builder()
                .method(method)
                .uri(uri)
                .body(kube::client::Body::empty())
                .unwrap()
        };
        let path = "/apis/infrastructure.cluster.x-k8s.io/v1beta1/workspacetemplates";
        let shape = |m, q: &str| Shape::of(&request(m, &format!("{path}{q}")));
        assert_eq!(shape("GET", "?limit=50"), Some(Shape::List));
        assert_eq!(
            shape("GET", "?watch=true&resourceVersion=5"),
            Some(Shape::Watch)
        );
        assert_eq!(
            shape("GET", "?resourceVersion=5&watch=1"),
            Some(Shape::Watch)
        );
        assert_eq!(shape("PATCH", "?fieldManager=m"), None);
    }
}
