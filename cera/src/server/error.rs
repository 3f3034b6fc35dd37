//! Errors as OpenAI's API writes them: a status code and
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::engine::EngineError;

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `not_found_error`,
    /// `rate_limit_error`, `server_error`, `unavailable_error`.
    pub kind: &'static str,
    /// What went wrong, for a person.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, kind, message: message.into(), param: None, code: None }
    }

    /// 400: the request is wrong; `param` names the field.
    pub fn bad_request(param: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError { param: param.map(str::to_string), ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message) }
    }

    /// 400 for a field this server does not implement: it is never silently ignored.
    pub fn unsupported(param: &str, what: impl std::fmt::Display) -> ApiError {
        ApiError { code: Some("unsupported_parameter"), ..Self::bad_request(Some(param), format!("{what} is not supported by this server")) }
    }

    /// 401: a missing or wrong API key.
    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..Self::new(StatusCode::UNAUTHORIZED, "authentication_error", "a valid API key is required (Authorization: Bearer KEY)")
        }
    }

    /// 404: an unknown model or route.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { code: Some(code), ..Self::new(StatusCode::NOT_FOUND, "not_found_error", message) }
    }

    /// 413: the body is over the limit.
    pub fn too_large(limit: usize) -> ApiError {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", format!("the request body is over the limit of {limit} bytes"))
    }

    /// 429: the queue is full.
    pub fn busy(limit: usize) -> ApiError {
        ApiError {
            code: Some("queue_full"),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", format!("the server is at its limit of {limit} requests in flight; retry later"))
        }
    }

    /// 503: the model is still loading, or the server is shutting down.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", message)
    }

    /// 500: the engine failed.
    pub fn internal(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        match e {
            EngineError::ContextOverflow { .. } => ApiError { code: Some("context_length_exceeded"), ..ApiError::bad_request(Some("messages"), e.to_string()) },
            EngineError::Sampler { option, .. } => ApiError::bad_request(Some(option), e.to_string()),
            EngineError::TokenOutOfRange { .. } => ApiError::bad_request(Some("prompt"), e.to_string()),
            EngineError::Template(_) => ApiError::bad_request(Some("messages"), e.to_string()),
            EngineError::Usage(_) => ApiError::bad_request(None, e.to_string()),
            _ => ApiError::internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
