//! A CRI call's outcome as gRPC's status code: what a recorded call ended with, what
//! replay answers with, and the number an OTLP span carries.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// gRPC's status codes, in the order of their numbers (0 to 16). In a trace's JSON a code
/// is its name as gRPC's Go and Rust libraries print it, except success, which podlapse
/// has always written `OK`. A name outside the set is refused when a trace is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GrpcCode {
    #[serde(rename = "OK")]
    Ok,
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl GrpcCode {
    /// Every code, by number.
    pub const ALL: [GrpcCode; 17] = [
        GrpcCode::Ok,
        GrpcCode::Cancelled,
        GrpcCode::Unknown,
        GrpcCode::InvalidArgument,
        GrpcCode::DeadlineExceeded,
        GrpcCode::NotFound,
        GrpcCode::AlreadyExists,
        GrpcCode::PermissionDenied,
        GrpcCode::ResourceExhausted,
        GrpcCode::FailedPrecondition,
        GrpcCode::Aborted,
        GrpcCode::OutOfRange,
        GrpcCode::Unimplemented,
        GrpcCode::Internal,
        GrpcCode::Unavailable,
        GrpcCode::DataLoss,
        GrpcCode::Unauthenticated,
    ];

    /// The code's name as a trace records it.
    pub fn as_str(self) -> &'static str {
        match self {
            GrpcCode::Ok => "OK",
            GrpcCode::Cancelled => "Cancelled",
            GrpcCode::Unknown => "Unknown",
            GrpcCode::InvalidArgument => "InvalidArgument",
            GrpcCode::DeadlineExceeded => "DeadlineExceeded",
            GrpcCode::NotFound => "NotFound",
            GrpcCode::AlreadyExists => "AlreadyExists",
            GrpcCode::PermissionDenied => "PermissionDenied",
            GrpcCode::ResourceExhausted => "ResourceExhausted",
            GrpcCode::FailedPrecondition => "FailedPrecondition",
            GrpcCode::Aborted => "Aborted",
            GrpcCode::OutOfRange => "OutOfRange",
            GrpcCode::Unimplemented => "Unimplemented",
            GrpcCode::Internal => "Internal",
            GrpcCode::Unavailable => "Unavailable",
            GrpcCode::DataLoss => "DataLoss",
            GrpcCode::Unauthenticated => "Unauthenticated",
        }
    }

    /// The code's number on the wire (`grpc-status`).
    pub fn number(self) -> i32 {
        self as i32
    }

    /// The code of a wire number; gRPC maps a number it does not know to `Unknown`.
    pub fn from_number(n: i32) -> GrpcCode {
        usize::try_from(n)
            .ok()
            .and_then(|i| GrpcCode::ALL.get(i).copied())
            .unwrap_or(GrpcCode::Unknown)
    }

    pub fn is_ok(self) -> bool {
        self == GrpcCode::Ok
    }
}

impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no gRPC status code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownGrpcCode(pub String);

impl fmt::Display for UnknownGrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a gRPC status code", self.0)
    }
}

impl std::error::Error for UnknownGrpcCode {}

impl FromStr for GrpcCode {
    type Err = UnknownGrpcCode;

    fn from_str(s: &str) -> Result<GrpcCode, UnknownGrpcCode> {
        GrpcCode::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownGrpcCode(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_is_its_name_in_json_and_its_number_on_the_wire() {
        for (n, c) in GrpcCode::ALL.into_iter().enumerate() {
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
            assert_eq!(serde_json::from_str::<GrpcCode>(&json).unwrap(), c);
            assert_eq!(c.as_str().parse::<GrpcCode>(), Ok(c));
            assert_eq!(c.number(), n as i32);
            assert_eq!(GrpcCode::from_number(n as i32), c);
        }
        assert_eq!(serde_json::to_string(&GrpcCode::Ok).unwrap(), "\"OK\"");
        assert_eq!(GrpcCode::DeadlineExceeded.number(), 4);
        assert_eq!(GrpcCode::Unauthenticated.number(), 16);
    }

    #[test]
    fn a_number_grpc_does_not_define_is_unknown() {
        assert_eq!(GrpcCode::from_number(17), GrpcCode::Unknown);
        assert_eq!(GrpcCode::from_number(-1), GrpcCode::Unknown);
    }

    #[test]
    fn a_name_that_is_no_code_is_refused_by_name() {
        let err = serde_json::from_str::<GrpcCode>("\"Canceled\"").unwrap_err();
        assert!(err.to_string().contains("Canceled"), "{err}");
        assert_eq!(
            "Nope".parse::<GrpcCode>().unwrap_err().to_string(),
            "\"Nope\" is not a gRPC status code"
        );
    }
}
