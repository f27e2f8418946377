//! Parsing the API server address that a Terraform output (or the connection Secret) gives
//! into a Cluster API endpoint: host without scheme, and a port.
//!
//! Accepted forms: `https://host`, `https://host:6443`, `http://host`, `host`, `host:8443`,
//! `https://[::1]:6443`, `[::1]:6443` and a bare IPv6 address; a trailing path, query or
//! fragment is ignored, and so is whitespace around the value (a Secret value often ends in a
//! newline). Without a port, `https` and a missing scheme mean 443, `http` means 80.

use crate::api::ApiEndpoint;
use std::net::Ipv6Addr;

/// Why an endpoint string could not be parsed. Messages name the input (an endpoint is not a
/// secret), except for [`EndpointError::UserInfo`], which may carry a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// The value is empty or only whitespace.
    #[error("endpoint is empty")]
    Empty,
    /// The value contains whitespace inside it.
    #[error("endpoint {input:?} contains whitespace")]
    Whitespace {
        /// The value as given.
        input: String,
    },
    /// The scheme is neither `http` nor `https`.
    #[error("endpoint {input:?} has unsupported scheme {scheme:?}: expected http or https")]
    UnsupportedScheme {
        /// The value as given.
        input: String,
        /// The scheme found.
        scheme: String,
    },
    /// There is no host before the port or path.
    #[error("endpoint {input:?} has no host")]
    MissingHost {
        /// The value as given.
        input: String,
    },
    /// The host holds characters a host name or IP address cannot hold.
    #[error("endpoint {input:?} has invalid host {host:?}")]
    InvalidHost {
        /// The value as given.
        input: String,
        /// The host found.
        host: String,
    },
    /// The port is not a number from 1 to 65535.
    #[error("endpoint {input:?} has invalid port {port:?}: expected a number from 1 to 65535")]
    InvalidPort {
        /// The value as given.
        input: String,
        /// The port found.
        port: String,
    },
    /// The value carries user information (`user:password@`); the value is not repeated.
    #[error("endpoint must not contain user information")]
    UserInfo,
}

/// Parses an API server address into host and port.
///
/// # Example
/// ```
/// use capt_controller::status::endpoint::parse_endpoint;
/// let e = parse_endpoint("https://ABC.gr7.ap-northeast-1.eks.amazonaws.com").unwrap();
/// assert_eq!((e.host.as_str(), e.port), ("ABC.gr7.ap-northeast-1.eks.amazonaws.com", 443));
/// ```
pub fn parse_endpoint(s: &str) -> Result<ApiEndpoint, EndpointError> {
    let input = s.trim();
    if input.is_empty() {
        return Err(EndpointError::Empty);
    }
    if input.chars().any(char::is_whitespace) {
        return Err(EndpointError::Whitespace {
            input: input.into(),
        });
    }
    let (default_port, rest) = split_scheme(input)?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err(EndpointError::UserInfo);
    }
    let (host, port) = split_host_port(input, authority)?;
    let port = match port {
        None => default_port,
        Some(p) => parse_port(input, p)?,
    };
    Ok(ApiEndpoint {
        host: host.into(),
        port,
    })
}

/// True when the endpoint has a host and a port from 1 to 65535 (Cluster API's `IsValid`,
/// plus the port range).
pub fn is_valid(endpoint: &ApiEndpoint) -> bool {
    !endpoint.host.is_empty() && (1..=65535).contains(&endpoint.port)
}

/// Renders an endpoint as `host:port`, with an IPv6 host in brackets.
pub fn display(endpoint: &ApiEndpoint) -> String {
    if endpoint.host.contains(':') {
        format!("[{}]:{}", endpoint.host, endpoint.port)
    } else {
        format!("{}:{}", endpoint.host, endpoint.port)
    }
}

/// Splits off the scheme; returns the default port it implies and the rest.
fn split_scheme(input: &str) -> Result<(i32, &str), EndpointError> {
    let Some((scheme, rest)) = input.split_once("://") else {
        return Ok((443, input));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "https" => Ok((443, rest)),
        "http" => Ok((80, rest)),
        _ => Err(EndpointError::UnsupportedScheme {
            input: input.into(),
            scheme: scheme.into(),
        }),
    }
}

/// Splits `host[:port]`, `[v6][:port]` or a bare IPv6 address.
fn split_host_port<'a>(
    input: &str,
    authority: &'a str,
) -> Result<(&'a str, Option<&'a str>), EndpointError> {
    let invalid_host = |host: &str| EndpointError::InvalidHost {
        input: input.into(),
        host: host.into(),
    };
    if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| invalid_host(authority))?;
        host.parse::<Ipv6Addr>().map_err(|_| invalid_host(host))?;
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err(invalid_host(authority)),
            },
        };
    }
    if authority.matches(':').count() > 1 {
        authority
            .parse::<Ipv6Addr>()
            .map_err(|_| invalid_host(authority))?;
        return Ok((authority, None));
    }
    let (host, port) = match authority.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    };
    if host.is_empty() {
        return Err(EndpointError::MissingHost {
            input: input.into(),
        });
    }
    let host_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    if !host.chars().all(host_char) {
        return Err(invalid_host(host));
    }
    Ok((host, port))
}

/// Parses a decimal port from 1 to 65535.
fn parse_port(input: &str, port: &str) -> Result<i32, EndpointError> {
    let digits = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
    match port.parse::<u32>() {
        Ok(p) if digits && (1..=65535).contains(&p) => Ok(p as i32),
        _ => Err(EndpointError::InvalidPort {
            input: input.into(),
            port: port.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> (String, i32) {
        let e = parse_endpoint(s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        (e.host, e.port)
    }

    fn err(s: &str) -> String {
        parse_endpoint(s).unwrap_err().to_string()
    }

    #[test]
    fn accepted_forms_give_host_without_scheme_and_the_right_port() {
        let cases: &[(&str, &str, i32)] = &[
            (
                "https://ABC.gr7.ap-northeast-1.eks.amazonaws.com",
                "ABC.gr7.ap-northeast-1.eks.amazonaws.com",
                443,
            ),
            ("https://host:6443", "host", 6443),
            ("host:8443", "host", 8443),
            ("host", "host", 443),
            ("https://[::1]:6443", "::1", 6443),
            ("[fd00::1]", "fd00::1", 443),
            ("fd00::1", "fd00::1", 443),
            ("https://host/", "host", 443),
            ("https://host:6443/some/path?x=1#f", "host", 6443),
            ("HTTPS://host", "host", 443),
            ("http://10.0.0.1", "10.0.0.1", 80),
            ("http://10.0.0.1:8080", "10.0.0.1", 8080),
            ("  https://host:6443\n", "host", 6443),
            ("host:65535", "host", 65535),
            ("host:1", "host", 1),
        ];
        for (input, host, port) in cases {
            assert_eq!(ok(input), (host.to_string(), *port), "{input:?}");
        }
    }

    #[test]
    fn empty_and_blank_values_are_rejected() {
        assert_eq!(err(""), "endpoint is empty");
        assert_eq!(err("  \n"), "endpoint is empty");
    }

    #[test]
    fn whitespace_inside_is_rejected_naming_the_input() {
        assert_eq!(
            err("https://ho st"),
            r#"endpoint "https://ho st" contains whitespace"#
        );
    }

    #[test]
    fn schemes_other_than_http_and_https_are_rejected() {
        assert_eq!(
            err("ftp://host"),
            r#"endpoint "ftp://host" has unsupported scheme "ftp": expected http or https"#
        );
        assert!(err("tcp://host:443").contains("unsupported scheme \"tcp\""));
    }

    #[test]
    fn invalid_ports_are_rejected_naming_the_input_and_port() {
        for (input, port) in [
            ("host:0", "0"),
            ("host:65536", "65536"),
            ("https://host:99999999999", "99999999999"),
            ("host:abc", "abc"),
            ("host:", ""),
            ("host:+443", "+443"),
            ("https://[::1]:0", "0"),
        ] {
            let message = err(input);
            assert_eq!(
                message,
                format!(
                    "endpoint {input:?} has invalid port {port:?}: expected a number from 1 to 65535"
                )
            );
        }
    }

    #[test]
    fn missing_or_malformed_hosts_are_rejected() {
        assert!(err("https://").contains("has no host"));
        assert!(err("https://:6443").contains("has no host"));
        assert!(err("https://[::1").contains("invalid host"));
        assert!(err("https://[zz::1]:6443").contains("invalid host \"zz::1\""));
        assert!(err("https://[::1]x").contains("invalid host"));
        assert!(err("a:b:c").contains("invalid host"));
        assert!(err("ho%st").contains("invalid host \"ho%st\""));
    }

    #[test]
    fn user_information_is_rejected_without_repeating_the_value() {
        let message = err("https://admin:s3cret@host");
        assert_eq!(message, "endpoint must not contain user information");
        assert!(!message.contains("s3cret"));
    }

    #[test]
    fn validity_requires_a_host_and_a_port_in_range() {
        let e = |host: &str, port| ApiEndpoint {
            host: host.into(),
            port,
        };
        assert!(is_valid(&e("h", 443)));
        assert!(!is_valid(&e("", 443)));
        assert!(!is_valid(&e("h", 0)));
        assert!(!is_valid(&e("h", 70000)));
    }

    #[test]
    fn display_brackets_ipv6_hosts() {
        assert_eq!(
            display(&ApiEndpoint {
                host: "h".into(),
                port: 443
            }),
            "h:443"
        );
        assert_eq!(
            display(&ApiEndpoint {
                host: "::1".into(),
                port: 6443
            }),
            "[::1]:6443"
        );
    }
}
