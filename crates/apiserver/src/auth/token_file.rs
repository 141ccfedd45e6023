//! The static token file (`--token-auth-file`, kube-apiserver's CSV format): parsed once at start into users,
//! its tokens compared in constant time. Separate from the other authenticators because of its CSV reader.

use super::{Authenticator, User, constant_time_eq};

/// The users of a static token file, kube-apiserver's `--token-auth-file`: a CSV file with one record per token,
/// `token,user,uid[,"group1,group2,..."]`. Read once at start (as kube-apiserver does; a change needs a restart).
///
/// The format follows kube-apiserver (Go's `encoding/csv` with a variable number of fields): fields may be quoted
/// with `"` (a quote inside is doubled, and a quoted field may hold commas and newlines), empty lines are skipped,
/// there are no comments, and a record needs at least three fields (token, user name, uid) or the file is refused.
/// A record with an empty token is skipped; when a token appears twice, the later record wins. The groups are the
/// fourth field split at commas (empty names dropped); `system:masters` makes the user an admin. The uid is read
/// and not used (nothing here records it). One difference: a record with an empty user name is refused (kube-apiserver
/// would authenticate a user without a name).
///
/// Tokens are compared in constant time, never logged, and never part of an error: errors name the line.
pub struct TokenFile {
    /// (token, user), in file order; a later duplicate token wins.
    entries: Vec<(String, User)>,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens.
        f.debug_struct("TokenFile")
            .field(
                "users",
                &self.users().map(|u| u.name.as_str()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A static token file that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("token file {path}: {reason}")]
pub struct TokenFileError {
    /// The file.
    pub path: std::path::PathBuf,
    /// Why (a line number and what is wrong with it; never a token).
    pub reason: String,
}

impl TokenFile {
    /// Reads and parses the file at `path`.
    pub fn load(path: &std::path::Path) -> Result<Self, TokenFileError> {
        let error = |reason: String| TokenFileError {
            path: path.to_owned(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|err| error(err.to_string()))?;
        Self::parse(&text).map_err(error)
    }

    /// Parses the text of a token file; Err names the line and the problem.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries: Vec<(String, User)> = Vec::new();
        for (line, fields) in csv_records(text)? {
            if fields.len() < 3 {
                return Err(format!(
                    "line {line}: a record must have at least 3 columns (token, user name, user uid), found {}",
                    fields.len()
                ));
            }
            let mut fields = fields.into_iter();
            let (token, name) = (
                fields.next().unwrap_or_default(),
                fields.next().unwrap_or_default(),
            );
            let _uid = fields.next();
            if token.is_empty() {
                tracing::warn!(line, "token file: a record with an empty token is skipped");
                continue;
            }
            if name.is_empty() {
                return Err(format!("line {line}: the user name is empty"));
            }
            let groups = fields
                .next()
                .map(|groups| {
                    groups
                        .split(',')
                        .filter(|g| !g.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            if let Some(index) = entries
                .iter()
                .position(|(known, _)| constant_time_eq(known.as_bytes(), token.as_bytes()))
            {
                tracing::warn!(line, "token file: a token appears twice; the later record wins");
                entries.remove(index);
            }
            entries.push((token, User { name, groups }));
        }
        Ok(Self { entries })
    }

    /// The users, in file order.
    pub fn users(&self) -> impl Iterator<Item = &User> {
        self.entries.iter().map(|(_, user)| user)
    }
}

impl Authenticator for TokenFile {
    fn authenticate(&self, token: &str) -> Option<User> {
        // Every entry is compared (tokens are unique after parsing), so the time taken does not tell which matched.
        let mut found = None;
        for (known, user) in &self.entries {
            if constant_time_eq(known.as_bytes(), token.as_bytes()) {
                found = Some(user);
            }
        }
        found.cloned()
    }
}

/// The records of a CSV text as Go's `encoding/csv` reads them by default (variable field count): (line of the
/// record's start, fields). Quoted fields may hold commas, newlines and doubled quotes; a quote inside an unquoted
/// field or after a quoted one is an error; empty lines are skipped; `\r\n` ends a line like `\n`.
fn csv_records(text: &str) -> Result<Vec<(usize, Vec<String>)>, String> {
    let text = text.replace("\r\n", "\n");
    let mut chars = text.chars().peekable();
    let mut records = Vec::new();
    let mut line = 1;
    while let Some(&first) = chars.peek() {
        if first == '\n' {
            chars.next();
            line += 1;
            continue;
        }
        let start = line;
        let mut fields = Vec::new();
        loop {
            let mut field = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                loop {
                    match chars.next() {
                        None => return Err(format!("line {start}: a quoted field is not closed")),
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            field.push('"');
                        }
                        Some('"') => break,
                        Some(c) => {
                            if c == '\n' {
                                line += 1;
                            }
                            field.push(c);
                        }
                    }
                }
                if !matches!(chars.peek(), None | Some(',' | '\n')) {
                    return Err(format!("line {line}: extraneous or missing \" in a quoted field"));
                }
            } else {
                while let Some(&c) = chars.peek() {
                    match c {
                        ',' | '\n' => break,
                        '"' => return Err(format!("line {line}: bare \" in a non-quoted field")),
                        _ => {
                            field.push(c);
                            chars.next();
                        }
                    }
                }
            }
            fields.push(field);
            match chars.next() {
                Some(',') => {}
                Some('\n') => {
                    line += 1;
                    break;
                }
                _ => break,
            }
        }
        records.push((start, fields));
    }
    Ok(records)
}
