//! Who may use the page. On a loopback address anyone on the machine may (as with the
//! CLI); on any other address every request needs the credentials of the config's
//! `[ui]` section — basic auth (`user` and `password`) or a bearer `token` — and the
//! page refuses to start without them. There is no default password.

use std::net::SocketAddr;
use std::path::Path;

use base64::Engine as _;
use serde::Deserialize;

/// The `[ui]` section of a `fusebox.toml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UiSection {
    /// Where to listen when `--listen` is not given.
    pub listen: Option<String>,
    /// Basic auth: the operator's user name (recorded as `by`) and password.
    pub user: Option<String>,
    pub password: Option<String>,
    /// Bearer token (for scripts), as `Authorization: Bearer <token>`.
    pub token: Option<String>,
}

impl UiSection {
    /// The `[ui]` section of the config file (absent: empty).
    pub fn from_config_file(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut doc: toml::Table =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        match doc.remove("ui") {
            None => Ok(UiSection::default()),
            Some(section) => section
                .try_into()
                .map_err(|e: toml::de::Error| format!("{}: [ui]: {}", path.display(), e.message())),
        }
    }
}

/// The credentials a request must bring; `Open` on loopback only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    Open,
    Required {
        basic: Option<(String, String)>,
        token: Option<String>,
    },
}

/// Who made a request, as the page records it in `by`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Loopback, no credentials asked: the operator running the page.
    Local,
    /// Basic auth's user.
    User(String),
    /// Bearer token.
    Token,
}

impl Access {
    /// What listening on `addr` with `section`'s credentials requires, or why it may
    /// not start.
    pub fn for_listener(addr: SocketAddr, section: &UiSection) -> Result<Access, String> {
        let nonempty =
            |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(str::to_owned);
        let basic = match (nonempty(&section.user), nonempty(&section.password)) {
            (Some(user), Some(password)) => Some((user, password)),
            (None, None) => None,
            _ => return Err("[ui] user and password go together (basic auth)".to_owned()),
        };
        let token = nonempty(&section.token);
        if basic.is_none() && token.is_none() {
            if addr.ip().is_loopback() {
                return Ok(Access::Open);
            }
            return Err(format!(
                "{addr} is not a loopback address: anyone who reaches it could cancel and resume runs, \
                 so set [ui] user and password (basic auth) or [ui] token in the config file"
            ));
        }
        Ok(Access::Required { basic, token })
    }

    /// Checks a request's `Authorization` header; `None` = refused.
    pub fn admit(&self, authorization: Option<&str>) -> Option<Caller> {
        let Access::Required { basic, token } = self else {
            return Some(Caller::Local);
        };
        let header = authorization?;
        if let (Some(expected), Some(given)) = (token, header.strip_prefix("Bearer ")) {
            return same(expected.as_bytes(), given.trim().as_bytes()).then_some(Caller::Token);
        }
        let (user, password) = basic.as_ref()?;
        let encoded = header.strip_prefix("Basic ")?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()?;
        let expected = format!("{user}:{password}");
        same(expected.as_bytes(), &decoded).then(|| Caller::User(user.clone()))
    }

    /// What the start-up line says about it.
    pub fn describe(&self) -> &'static str {
        match self {
            Access::Open => "loopback only, no credentials asked",
            Access::Required {
                basic: Some(_),
                token: Some(_),
            } => "every request needs [ui] basic auth or the bearer token",
            Access::Required { basic: Some(_), .. } => "every request needs [ui] basic auth",
            Access::Required { .. } => "every request needs the [ui] bearer token",
        }
    }
}

/// Equality in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(user: Option<&str>, password: Option<&str>, token: Option<&str>) -> UiSection {
        UiSection {
            listen: None,
            user: user.map(str::to_owned),
            password: password.map(str::to_owned),
            token: token.map(str::to_owned),
        }
    }

    #[test]
    fn listeners_and_what_they_require() {
        let loopback: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let v6_loopback: SocketAddr = "[::1]:8080".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let none = section(None, None, None);
        let cases: [(SocketAddr, UiSection, Result<bool, &str>); 6] = [
            (loopback, none.clone(), Ok(false)),
            (v6_loopback, none.clone(), Ok(false)),
            (any, none.clone(), Err("not a loopback address")),
            (
                any,
                // An empty password is no password: never a way to open the page.
                section(Some("ops"), Some(""), None),
                Err("go together"),
            ),
            (
                any,
                section(Some("ops"), None, Some("t")),
                Err("go together"),
            ),
            (any, section(None, None, Some("t")), Ok(true)),
        ];
        for (addr, section, want) in cases {
            match (Access::for_listener(addr, &section), want) {
                (Ok(access), Ok(required)) => {
                    assert_eq!(access != Access::Open, required, "{addr} {section:?}")
                }
                (Err(err), Err(words)) => assert!(err.contains(words), "{err}"),
                (got, want) => panic!("{addr} {section:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn requests_bring_the_credentials_or_are_refused() {
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        let access =
            Access::for_listener(any, &section(Some("ops"), Some("s3cret"), Some("tok"))).unwrap();
        let basic = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        let cases = [
            (None, None),
            (
                Some(basic("ops:s3cret")),
                Some(Caller::User("ops".to_owned())),
            ),
            (Some(basic("ops:wrong")), None),
            (Some(basic("other:s3cret")), None),
            (Some("Bearer tok".to_owned()), Some(Caller::Token)),
            (Some("Bearer tok2".to_owned()), None),
            (Some("Basic !!!".to_owned()), None),
        ];
        for (header, want) in cases {
            assert_eq!(access.admit(header.as_deref()), want, "{header:?}");
        }
        assert_eq!(Access::Open.admit(None), Some(Caller::Local));
    }
}
