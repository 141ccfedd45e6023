//! Label and field selectors, as clients send them in `?labelSelector=` and `?fieldSelector=`.
//!
//! The label selector grammar is the one of Kubernetes `labels.Parse`: comma-separated requirements
//! `key=value`, `key==value`, `key!=value`, `key in (v1,v2)`, `key notin (v1,v2)`, `key` (exists), `!key`
//! (does not exist), and `key>N` / `key<N` (integer comparison), with white space allowed around tokens. Keys
//! and values are validated as Kubernetes validates label keys and values.
//!
//! The field selector grammar is the one of Kubernetes `fields.ParseSelector`: comma-separated `field=value`,
//! `field==value` and `field!=value`, where values may be empty and `\,`, `\=` and `\\` escape those
//! characters. Which fields a resource supports is the caller's business ([`FieldSelector::fields`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::naming;

/// Why a label or field selector was refused; the messages follow the wording of Kubernetes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    /// A label selector requirement is malformed: bad key, bad value, bad operator or bad value set.
    #[error("unable to parse requirement: {0}")]
    Requirement(String),
    /// A label selector is malformed between requirements (a missing comma, a stray token).
    #[error("{0}")]
    Syntax(String),
    /// A field selector term has no operator or no field name.
    #[error("invalid selector: '{selector}'; can't understand '{term}'")]
    FieldTerm {
        /// The whole selector as received.
        selector: String,
        /// The term that could not be understood.
        term: String,
    },
    /// A field selector value holds an unescaped `,` or `=`.
    #[error("invalid field selector: unescaped character in value: {0:?}")]
    UnescapedCharacter(char),
    /// A field selector value holds a backslash that escapes nothing it may escape.
    #[error("invalid field selector: invalid escape sequence: {0}")]
    InvalidEscape(String),
}

/// How one label requirement compares the label value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LabelOperator {
    /// `=` or `==`: the label is present with this value.
    Equals,
    /// `!=`: the label is absent or has another value.
    NotEquals,
    /// `in (..)`: the label is present with one of these values.
    In,
    /// `notin (..)`: the label is absent or has none of these values.
    NotIn,
    /// `key`: the label is present.
    Exists,
    /// `!key`: the label is absent.
    DoesNotExist,
    /// `key>N`: the label is present, is an integer and is greater than N.
    GreaterThan,
    /// `key<N`: the label is present, is an integer and is less than N.
    LessThan,
}

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LabelRequirement {
    key: String,
    operator: LabelOperator,
    /// The value set; empty for Exists and DoesNotExist, one value for the comparisons.
    values: BTreeSet<String>,
}

impl LabelRequirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            LabelOperator::Equals | LabelOperator::In => value.is_some_and(|v| self.values.contains(v)),
            LabelOperator::NotEquals | LabelOperator::NotIn => {
                !value.is_some_and(|v| self.values.contains(v))
            }
            LabelOperator::Exists => value.is_some(),
            LabelOperator::DoesNotExist => value.is_none(),
            LabelOperator::GreaterThan | LabelOperator::LessThan => {
                let Some(actual) = value.and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                // Validated at parse time: exactly one integer value.
                let Some(bound) = self.values.iter().next().and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                if self.operator == LabelOperator::GreaterThan {
                    actual > bound
                } else {
                    actual < bound
                }
            }
        }
    }
}

/// A parsed label selector: every requirement must hold for an object to be selected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    /// Parses the Kubernetes label selector syntax.
    ///
    /// The empty string (or only white space) is the selector that matches everything.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        LabelParser::new(text).parse()
    }

    /// True when every requirement holds for these labels. An empty selector matches everything.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// True for the selector without requirements, so callers can skip filtering.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// A token of the label selector language.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Identifier(String),
    /// `!` before a key.
    Not,
    /// `!=`
    NotEquals,
    /// `=`
    Equals,
    /// `==`
    DoubleEquals,
    /// `>`
    GreaterThan,
    /// `<`
    LessThan,
    OpenParen,
    CloseParen,
    Comma,
    End,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Identifier(s) => f.write_str(s),
            Token::Not => f.write_str("!"),
            Token::NotEquals => f.write_str("!="),
            Token::Equals => f.write_str("="),
            Token::DoubleEquals => f.write_str("=="),
            Token::GreaterThan => f.write_str(">"),
            Token::LessThan => f.write_str("<"),
            Token::OpenParen => f.write_str("("),
            Token::CloseParen => f.write_str(")"),
            Token::Comma => f.write_str(","),
            Token::End => Ok(()),
        }
    }
}

/// Characters that end an identifier and start an operator or punctuation.
fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

/// Splits a label selector into tokens, white space separating them.
fn tokenize(text: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_ascii_whitespace() {
            chars.next();
            continue;
        }
        if is_special(c) {
            chars.next();
            let next = chars.peek().copied();
            let token = match (c, next) {
                ('!', Some('=')) => {
                    chars.next();
                    Token::NotEquals
                }
                ('=', Some('=')) => {
                    chars.next();
                    Token::DoubleEquals
                }
                ('!', _) => Token::Not,
                ('=', _) => Token::Equals,
                ('>', _) => Token::GreaterThan,
                ('<', _) => Token::LessThan,
                ('(', _) => Token::OpenParen,
                (')', _) => Token::CloseParen,
                _ => Token::Comma,
            };
            tokens.push(token);
            continue;
        }
        let mut identifier = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_whitespace() || is_special(c) {
                break;
            }
            identifier.push(c);
            chars.next();
        }
        tokens.push(Token::Identifier(identifier));
    }
    tokens
}

/// A recursive-descent parser over the tokens of one label selector.
struct LabelParser {
    tokens: Vec<Token>,
    position: usize,
}

impl LabelParser {
    fn new(text: &str) -> Self {
        LabelParser {
            tokens: tokenize(text),
            position: 0,
        }
    }

    fn peek(&self) -> &Token {
        self.tokens.get(self.position).unwrap_or(&Token::End)
    }

    fn next(&mut self) -> Token {
        let token = self.tokens.get(self.position).cloned().unwrap_or(Token::End);
        if token != Token::End {
            self.position += 1;
        }
        token
    }

    fn parse(mut self) -> Result<LabelSelector, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            match self.peek() {
                Token::End => return Ok(LabelSelector { requirements }),
                Token::Identifier(_) | Token::Not => {
                    requirements.push(self.parse_requirement().map_err(SelectorError::Requirement)?);
                    match self.next() {
                        Token::End => return Ok(LabelSelector { requirements }),
                        Token::Comma => {
                            let after = self.peek();
                            if !matches!(after, Token::Identifier(_) | Token::Not) {
                                return Err(SelectorError::Syntax(format!(
                                    "found '{after}', expected: identifier after ','"
                                )));
                            }
                        }
                        other => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{other}', expected: ',' or 'end of string'"
                            )));
                        }
                    }
                }
                other => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{other}', expected: !, identifier, or 'end of string'"
                    )));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<LabelRequirement, String> {
        let negated = *self.peek() == Token::Not;
        if negated {
            self.next();
        }
        let key = match self.next() {
            Token::Identifier(key) => key,
            other => return Err(format!("found '{other}', expected: identifier")),
        };
        validate_label_key(&key)?;
        if negated {
            return Ok(LabelRequirement {
                key,
                operator: LabelOperator::DoesNotExist,
                values: BTreeSet::new(),
            });
        }
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(LabelRequirement {
                key,
                operator: LabelOperator::Exists,
                values: BTreeSet::new(),
            });
        }
        let operator = match self.next() {
            Token::Equals | Token::DoubleEquals => LabelOperator::Equals,
            Token::NotEquals => LabelOperator::NotEquals,
            Token::GreaterThan => LabelOperator::GreaterThan,
            Token::LessThan => LabelOperator::LessThan,
            Token::Identifier(word) if word == "in" => LabelOperator::In,
            Token::Identifier(word) if word == "notin" => LabelOperator::NotIn,
            other => {
                return Err(format!("found '{other}', expected: in, notin, =, ==, !=, gt, lt"));
            }
        };
        let values = match operator {
            LabelOperator::In | LabelOperator::NotIn => self.parse_value_set()?,
            _ => BTreeSet::from([self.parse_exact_value()?]),
        };
        if matches!(operator, LabelOperator::GreaterThan | LabelOperator::LessThan) {
            for value in &values {
                if value.parse::<i64>().is_err() {
                    return Err(format!(
                        "values[0]: Invalid value: {value:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                    ));
                }
            }
        } else {
            for (index, value) in values.iter().enumerate() {
                validate_label_value(&key, index, value)?;
            }
        }
        Ok(LabelRequirement {
            key,
            operator,
            values,
        })
    }

    /// The value after `=`, `==`, `!=`, `>` or `<`: an identifier, or empty before a comma or the end.
    fn parse_exact_value(&mut self) -> Result<String, String> {
        match self.peek() {
            Token::End | Token::Comma => Ok(String::new()),
            Token::Identifier(_) => match self.next() {
                Token::Identifier(value) => Ok(value),
                _ => Ok(String::new()),
            },
            other => Err(format!("found '{other}', expected: identifier")),
        }
    }

    /// The `( v1, v2 )` after `in` or `notin`; an empty slot (`()`, `(a,)`) is the empty value.
    fn parse_value_set(&mut self) -> Result<BTreeSet<String>, String> {
        match self.next() {
            Token::OpenParen => {}
            other => return Err(format!("found '{other}', expected: '('")),
        }
        let mut values = BTreeSet::new();
        loop {
            let value = match self.peek() {
                Token::Comma | Token::CloseParen => String::new(),
                Token::Identifier(_) => match self.next() {
                    Token::Identifier(value) => value,
                    _ => String::new(),
                },
                other => return Err(format!("found '{other}', expected: ',', ')' or identifier")),
            };
            values.insert(value);
            match self.next() {
                Token::Comma => {}
                Token::CloseParen => return Ok(values),
                other => return Err(format!("found '{other}', expected: ',' or ')'")),
            }
        }
    }
}

/// Validates a label key as Kubernetes `IsQualifiedName` does ([`naming::qualified_name`]); the error names the key.
fn validate_label_key(key: &str) -> Result<(), String> {
    let problems = naming::qualified_name(key);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("key: Invalid value: {key:?}: {}", problems.join("; ")))
    }
}

/// Validates a label value as Kubernetes `IsValidLabelValue` does ([`naming::label_value`]); the error names the
/// key and the value.
fn validate_label_value(key: &str, index: usize, value: &str) -> Result<(), String> {
    let problems = naming::label_value(value);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "values[{index}][{key}]: Invalid value: {value:?}: {}",
            problems.join("; ")
        ))
    }
}

/// One term of a field selector: `field=value` (or `==`), or `field!=value` when `negated`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FieldRequirement {
    field: String,
    value: String,
    negated: bool,
}

/// A parsed field selector: every term must hold for an object to be selected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses the Kubernetes field selector syntax (`a.b=v,c!=w`, with `\,` `\=` `\\` escapes in values).
    ///
    /// The empty string is the selector that matches everything; empty terms (`a=b,,c=d`) are skipped.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for term in split_unescaped_commas(text) {
            if term.is_empty() {
                continue;
            }
            let understood = || SelectorError::FieldTerm {
                selector: text.to_owned(),
                term: term.to_owned(),
            };
            let (field, negated, raw_value) = split_term(term).ok_or_else(understood)?;
            let field = field.trim();
            if field.is_empty() {
                return Err(understood());
            }
            let value = unescape_field_value(raw_value)?;
            requirements.push(FieldRequirement {
                field: field.to_owned(),
                value,
                negated,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// The field paths used (e.g. "metadata.name", "spec.nodeName"), so the caller can refuse unsupported ones.
    ///
    /// Each field appears once, in the order of its first use.
    pub fn fields(&self) -> Vec<&str> {
        let mut fields: Vec<&str> = Vec::new();
        for requirement in &self.requirements {
            if !fields.contains(&requirement.field.as_str()) {
                fields.push(&requirement.field);
            }
        }
        fields
    }

    /// Evaluates against an object as JSON: the field path is looked up by dots ("involvedObject.kind" →
    /// `obj["involvedObject"]["kind"]`); a missing field or JSON null counts as the empty string; booleans and
    /// numbers compare by their JSON text ("true", "3").
    pub fn matches(&self, object: &serde_json::Value) -> bool {
        self.requirements.iter().all(|r| {
            let actual = field_text(object, &r.field);
            (actual == r.value) != r.negated
        })
    }

    /// True for the selector without terms, so callers can skip filtering.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// Splits a field selector on the commas that no backslash escapes.
fn split_unescaped_commas(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (index, c) in text.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            terms.push(&text[start..index]);
            start = index + 1;
        }
    }
    terms.push(&text[start..]);
    terms
}

/// Splits `field<op>value` at the first operator, `!=` and `==` taking precedence over `=` at one position.
fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    for (index, _) in term.char_indices() {
        let rest = &term[index..];
        if let Some(value) = rest.strip_prefix("!=") {
            return Some((&term[..index], true, value));
        }
        if let Some(value) = rest.strip_prefix("==") {
            return Some((&term[..index], false, value));
        }
        if let Some(value) = rest.strip_prefix('=') {
            return Some((&term[..index], false, value));
        }
    }
    None
}

/// Removes the escapes of a field selector value, refusing bare `,` `=` and unknown escapes.
fn unescape_field_value(raw: &str) -> Result<String, SelectorError> {
    let mut value = String::with_capacity(raw.len());
    let mut escaped = false;
    for c in raw.chars() {
        if escaped {
            if matches!(c, '\\' | ',' | '=') {
                value.push(c);
                escaped = false;
            } else {
                return Err(SelectorError::InvalidEscape(format!("\\{c}")));
            }
        } else if c == '\\' {
            escaped = true;
        } else if matches!(c, ',' | '=') {
            return Err(SelectorError::UnescapedCharacter(c));
        } else {
            value.push(c);
        }
    }
    if escaped {
        return Err(SelectorError::InvalidEscape("\\".to_owned()));
    }
    Ok(value)
}

/// The text a field selector compares for the dotted `path` in `object`.
fn field_text(object: &serde_json::Value, path: &str) -> String {
    let mut current = object;
    for segment in path.split('.') {
        match current.get(segment) {
            Some(next) => current = next,
            None => return String::new(),
        }
    }
    match current {
        serde_json::Value::Null => String::new(),
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn selects(selector: &str, pairs: &[(&str, &str)]) -> bool {
        LabelSelector::parse(selector)
            .unwrap_or_else(|e| panic!("{selector:?} should parse: {e}"))
            .matches(&labels(pairs))
    }

    #[test]
    fn empty_label_selector_matches_everything() {
        for text in ["", "   "] {
            let selector = LabelSelector::parse(text).unwrap();
            assert!(selector.is_empty());
            assert!(selector.matches(&labels(&[])));
            assert!(selector.matches(&labels(&[("a", "b")])));
        }
    }

    #[test]
    fn label_operators_table() {
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], bool);
        // (selector, labels, expected)
        let cases: &[Case] = &[
            ("app=web", &[("app", "web")], true),
            ("app=web", &[("app", "db")], false),
            ("app=web", &[], false),
            ("app==web", &[("app", "web")], true),
            ("app==web", &[("app", "db")], false),
            ("app!=web", &[("app", "db")], true),
            ("app!=web", &[("app", "web")], false),
            ("app!=web", &[], true),
            ("app in (web,db)", &[("app", "db")], true),
            ("app in (web,db)", &[("app", "cache")], false),
            ("app in (web,db)", &[], false),
            ("app notin (web,db)", &[("app", "cache")], true),
            ("app notin (web,db)", &[("app", "web")], false),
            ("app notin (web,db)", &[], true),
            ("app", &[("app", "")], true),
            ("app", &[("other", "x")], false),
            ("!app", &[("other", "x")], true),
            ("!app", &[("app", "x")], false),
            ("replicas>3", &[("replicas", "4")], true),
            ("replicas>3", &[("replicas", "3")], false),
            ("replicas>3", &[("replicas", "many")], false),
            ("replicas>3", &[], false),
            ("replicas<3", &[("replicas", "-1")], true),
            ("replicas<3", &[("replicas", "3")], false),
            ("app=", &[("app", "")], true),
            ("app=", &[("app", "x")], false),
            ("app in ()", &[("app", "")], true),
            ("app in (a,)", &[("app", "")], true),
            ("app in (a,)", &[("app", "a")], true),
            ("app in (a,)", &[("app", "b")], false),
            ("example.com/role=worker", &[("example.com/role", "worker")], true),
            (
                "node-role.kubernetes.io/control-plane",
                &[("node-role.kubernetes.io/control-plane", "")],
                true,
            ),
        ];
        for (selector, pairs, expected) in cases {
            assert_eq!(selects(selector, pairs), *expected, "{selector:?} on {pairs:?}");
        }
    }

    #[test]
    fn requirements_combine_with_and_and_tolerate_white_space() {
        let selector = " app = web , tier in ( front , back ) , !canary ";
        assert!(selects(selector, &[("app", "web"), ("tier", "back")]));
        assert!(!selects(
            selector,
            &[("app", "web"), ("tier", "back"), ("canary", "true")]
        ));
        assert!(!selects(selector, &[("app", "web"), ("tier", "middle")]));
        assert!(!selects(selector, &[("tier", "front")]));
    }

    #[test]
    fn keywords_can_be_keys_and_values() {
        assert!(selects("in=notin", &[("in", "notin")]));
        assert!(selects("x in (in,notin)", &[("x", "notin")]));
    }

    #[test]
    fn label_selectors_kubectl_sends() {
        assert!(selects(
            "machine.mcm.dev/pool=workers,!node-role.kubernetes.io/control-plane",
            &[("machine.mcm.dev/pool", "workers")]
        ));
        assert!(selects(
            "app.kubernetes.io/name in (coredns,kube-dns)",
            &[("app.kubernetes.io/name", "kube-dns")]
        ));
    }

    fn label_error(text: &str) -> SelectorError {
        match LabelSelector::parse(text) {
            Ok(selector) => panic!("{text:?} should be refused, parsed as {selector:?}"),
            Err(error) => error,
        }
    }

    #[test]
    fn malformed_label_selectors_are_refused() {
        // (selector, a fragment of the message)
        let cases = [
            ("app=web,", "found '', expected: identifier after ','"),
            ("app=web,,tier=x", "found ',', expected: identifier after ','"),
            ("app=web tier=x", "found 'tier', expected: ',' or 'end of string'"),
            (
                "app web",
                "unable to parse requirement: found 'web', expected: in, notin",
            ),
            ("=web", "found '=', expected: !, identifier, or 'end of string'"),
            (",app", "found ',', expected: !, identifier, or 'end of string'"),
            (
                "app in web",
                "unable to parse requirement: found 'web', expected: '('",
            ),
            (
                "app in (web",
                "unable to parse requirement: found '', expected: ',' or ')'",
            ),
            (
                "app in (a b)",
                "unable to parse requirement: found 'b', expected: ',' or ')'",
            ),
            ("app in (=)", "expected: ',', ')' or identifier"),
            ("app (x)", "found '(', expected: in, notin, =, ==, !=, gt, lt"),
            ("app foo (x)", "found 'foo', expected: in, notin"),
            ("app=(x)", "found '(', expected: identifier"),
            ("!", "found '', expected: identifier"),
            ("!app=x", "found '=', expected: ',' or 'end of string'"),
            ("replicas>three", "the value must be an integer"),
            ("replicas>", "the value must be an integer"),
            (
                "-app=x",
                "key: Invalid value: \"-app\": name part must consist of",
            ),
            ("app-=x", "key: Invalid value: \"app-\""),
            ("a/b/c=x", "key: Invalid value: \"a/b/c\": a qualified name"),
            ("/app=x", "prefix part must be non-empty"),
            ("Example.com/app=x", "prefix part a lowercase RFC 1123 subdomain"),
            ("example.com/=x", "name part must be non-empty"),
            (
                "app=-web",
                "values[0][app]: Invalid value: \"-web\": a valid label must be",
            ),
            ("app in (ok,bad!)", "found '!', expected: ',' or ')'"),
            ("app in (ok,bad_)", "values[0][app]: Invalid value: \"bad_\""),
            ("app=é", "Invalid value: \"é\""),
        ];
        for (text, fragment) in cases {
            let message = label_error(text).to_string();
            assert!(
                message.contains(fragment),
                "{text:?}: {message:?} lacks {fragment:?}"
            );
        }
    }

    #[test]
    fn label_keys_and_values_are_limited_to_63_characters() {
        let long = "a".repeat(64);
        let ok = "a".repeat(63);
        assert!(selects(&format!("{ok}={ok}"), &[(&ok, &ok)]));
        let message = label_error(&format!("{long}=x")).to_string();
        assert!(
            message.contains("name part must be no more than 63 characters"),
            "{message}"
        );
        let message = label_error(&format!("app={long}")).to_string();
        assert!(
            message.contains("must be no more than 63 characters"),
            "{message}"
        );
        let prefix = format!("{}.com", "a.".repeat(130));
        assert!(
            label_error(&format!("{prefix}/app=x"))
                .to_string()
                .contains("prefix part")
        );
    }

    #[test]
    fn label_errors_are_typed() {
        assert_eq!(
            label_error("app=web tier=x"),
            SelectorError::Syntax("found 'tier', expected: ',' or 'end of string'".to_owned())
        );
        assert!(matches!(label_error("app in web"), SelectorError::Requirement(_)));
    }

    fn field_selector(text: &str) -> FieldSelector {
        FieldSelector::parse(text).unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    #[test]
    fn kubectl_drain_pod_selector() {
        let selector =
            field_selector("spec.nodeName=trace-node-1,status.phase!=Succeeded,status.phase!=Failed");
        assert_eq!(selector.fields(), vec!["spec.nodeName", "status.phase"]);
        let pod = |node: &str, phase: &str| json!({"spec": {"nodeName": node}, "status": {"phase": phase}});
        assert!(selector.matches(&pod("trace-node-1", "Running")));
        assert!(!selector.matches(&pod("trace-node-1", "Succeeded")));
        assert!(!selector.matches(&pod("trace-node-1", "Failed")));
        assert!(!selector.matches(&pod("trace-node-2", "Running")));
        assert!(!selector.matches(&json!({"spec": {}})));
    }

    #[test]
    fn kubectl_describe_node_events_selector() {
        let selector = field_selector(
            "involvedObject.name=n1,involvedObject.namespace=,involvedObject.kind=Node,involvedObject.uid=abc",
        );
        assert_eq!(
            selector.fields(),
            vec![
                "involvedObject.name",
                "involvedObject.namespace",
                "involvedObject.kind",
                "involvedObject.uid"
            ]
        );
        let event = json!({"involvedObject": {"kind": "Node", "name": "n1", "uid": "abc"}});
        assert!(selector.matches(&event));
        let with_null_namespace =
            json!({"involvedObject": {"kind": "Node", "name": "n1", "uid": "abc", "namespace": null}});
        assert!(selector.matches(&with_null_namespace));
        let namespaced =
            json!({"involvedObject": {"kind": "Node", "name": "n1", "uid": "abc", "namespace": "x"}});
        assert!(!selector.matches(&namespaced));
        let other_uid = json!({"involvedObject": {"kind": "Node", "name": "n1", "uid": "abd"}});
        assert!(!selector.matches(&other_uid));
    }

    #[test]
    fn field_operators_table() {
        let object = json!({
            "metadata": {"name": "n1", "namespace": "default"},
            "spec": {"unschedulable": true, "replicas": 3, "empty": ""}
        });
        let cases = [
            ("metadata.name=n1", true),
            ("metadata.name==n1", true),
            ("metadata.name=n2", false),
            ("metadata.name!=n2", true),
            ("metadata.name!=n1", false),
            ("spec.unschedulable=true", true),
            ("spec.unschedulable!=true", false),
            ("spec.replicas=3", true),
            ("spec.empty=", true),
            ("spec.missing=", true),
            ("spec.missing!=", false),
            ("spec.missing=x", false),
            ("spec.missing!=x", true),
            ("metadata.name=n1,metadata.namespace=default", true),
            ("metadata.name=n1,metadata.namespace=kube-system", false),
            ("metadata.name.deeper=x", false),
            ("", true),
            ("metadata.name=n1,,", true),
        ];
        for (text, expected) in cases {
            assert_eq!(field_selector(text).matches(&object), expected, "{text:?}");
        }
    }

    #[test]
    fn field_values_unescape_backslashes() {
        let selector = field_selector(r"metadata.name=a\,b\=c\\d");
        assert!(selector.matches(&json!({"metadata": {"name": r"a,b=c\d"}})));
        assert!(!selector.matches(&json!({"metadata": {"name": r"a\,b\=c\\d"}})));
        assert_eq!(selector.fields(), vec!["metadata.name"]);
    }

    #[test]
    fn malformed_field_selectors_are_refused() {
        let cases = [
            (
                "metadata.name",
                SelectorError::FieldTerm {
                    selector: "metadata.name".to_owned(),
                    term: "metadata.name".to_owned(),
                },
            ),
            (
                "a=b,c",
                SelectorError::FieldTerm {
                    selector: "a=b,c".to_owned(),
                    term: "c".to_owned(),
                },
            ),
            (
                "=x",
                SelectorError::FieldTerm {
                    selector: "=x".to_owned(),
                    term: "=x".to_owned(),
                },
            ),
            ("a=b=c", SelectorError::UnescapedCharacter('=')),
            (r"a=b\x", SelectorError::InvalidEscape(r"\x".to_owned())),
            (r"a=b\", SelectorError::InvalidEscape(r"\".to_owned())),
        ];
        for (text, expected) in cases {
            assert_eq!(FieldSelector::parse(text), Err(expected), "{text:?}");
        }
        assert_eq!(
            FieldSelector::parse("metadata.name").map_err(|e| e.to_string()),
            Err("invalid selector: 'metadata.name'; can't understand 'metadata.name'".to_owned())
        );
    }

    #[test]
    fn short_strings_never_panic() {
        let alphabet = [
            'a', '=', '!', '(', ')', ',', ' ', '\\', '<', '>', '/', '.', 'é', '-',
        ];
        // Every string of length 1 to 4 over the alphabet.
        let mut level = vec![String::new()];
        let mut inputs = Vec::new();
        for _ in 0..4 {
            level = level
                .iter()
                .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
                .collect();
            inputs.extend(level.iter().cloned());
        }
        let mut parsed = 0;
        for input in &inputs {
            if let Ok(selector) = LabelSelector::parse(input) {
                selector.matches(&labels(&[("a", "a")]));
                parsed += 1;
            }
            if let Ok(selector) = FieldSelector::parse(input) {
                selector.matches(&json!({"a": "a"}));
            }
        }
        // The grammar accepts some of these (e.g. "a", "!a", "a=a") and refuses most.
        assert!(
            parsed > 10 && parsed < inputs.len() / 2,
            "{parsed} of {}",
            inputs.len()
        );
    }
}
