//! Where a placeholder stands in an inline HCL module. Pure: no API server.
//!
//! The renderer pastes a variable's value over `${KEY}`. Inside a string literal (quoted or a
//! heredoc) or a comment, a plain literal ([`crate::variables::plain_literal`]) stays text.
//! In code it is an expression: `value = ${TOKEN}` with the value `var.platform_token` hands
//! the tenant whatever the platform's module holds. So a template whose module has a
//! placeholder in code is refused, and its author told to quote it or pass the value as
//! `forProvider.vars`, where it is a Terraform variable's value.
//!
//! The scanner knows what it needs of HCL's syntax: quoted strings with `\` escapes,
//! `${ … }` and `%{ … }` templates inside them (code again, with strings of their own), the
//! `$${` and `%%{` escapes, heredocs (`<<EOT`, `<<-EOT`), and `#`, `//` and `/* */` comments.

/// Condition reason (and Warning Event reason) of an apply whose template has a placeholder
/// in code.
pub const PLACEHOLDER_IN_CODE: &str = "PlaceholderInCode";

/// What the scanner is inside of.
#[derive(Clone, Debug, PartialEq)]
enum Inside {
    /// Code; `braces` counts the `{` opened since a template's `${`/`%{` (a template's code
    /// ends at its matching `}`; the module's top level never does).
    Code { template: bool, braces: usize },
    /// A quoted string.
    Quoted,
    /// A heredoc ending at a line that is `marker` (indented, for `<<-`).
    Heredoc { marker: String },
}

/// The keys among `keys` whose `${KEY}` stands in code somewhere in `module`, each once, in
/// the order found.
pub fn placeholders_in_code<'a>(
    module: &str,
    keys: impl IntoIterator<Item = &'a str> + Clone,
) -> Vec<String> {
    let placeholder_at = |rest: &str| {
        keys.clone()
            .into_iter()
            .map(|key| format!("${{{key}}}"))
            .find(|p| rest.starts_with(p.as_str()))
    };
    let mut found: Vec<String> = Vec::new();
    let mut stack = vec![Inside::Code {
        template: false,
        braces: 0,
    }];
    let mut i = 0;
    let mut line_start = true;
    while i < module.len() {
        let rest = &module[i..];
        let c = rest.chars().next().expect("not at the end");
        let at_line_start = std::mem::replace(&mut line_start, c == '\n');
        let top = stack.last_mut().expect("the module's code is never left");
        match top {
            Inside::Code { template, braces } => {
                if let Some(p) = placeholder_at(rest) {
                    let key = p[2..p.len() - 1].to_owned();
                    if !found.contains(&key) {
                        found.push(key);
                    }
                    i += p.len();
                    continue;
                }
                if rest.starts_with('#') || rest.starts_with("//") {
                    i += rest.find('\n').unwrap_or(rest.len());
                    continue;
                }
                if rest.starts_with("/*") {
                    i += rest.find("*/").map_or(rest.len(), |end| end + 2);
                    continue;
                }
                if let Some(marker) = heredoc_marker(rest) {
                    i += rest.find('\n').map_or(rest.len(), |end| end + 1);
                    line_start = true;
                    stack.push(Inside::Heredoc { marker });
                    continue;
                }
                match c {
                    '"' => stack.push(Inside::Quoted),
                    '{' => *braces += 1,
                    '}' if *template && *braces == 0 => {
                        stack.pop();
                    }
                    '}' => *braces = braces.saturating_sub(1),
                    _ => {}
                }
            }
            Inside::Quoted | Inside::Heredoc { .. } => {
                if let Inside::Heredoc { marker } = &*top
                    && at_line_start
                    && rest.lines().next().map(str::trim) == Some(marker.as_str())
                {
                    stack.pop();
                    i += rest.find('\n').map_or(rest.len(), |end| end + 1);
                    line_start = true;
                    continue;
                }
                if let Some(p) = placeholder_at(rest) {
                    i += p.len(); // text: the value stays a value
                    continue;
                }
                if rest.starts_with("$${") || rest.starts_with("%%{") {
                    i += 3;
                    continue;
                }
                if rest.starts_with("${") || rest.starts_with("%{") {
                    stack.push(Inside::Code {
                        template: true,
                        braces: 0,
                    });
                    i += 2;
                    continue;
                }
                match (c, &*top) {
                    ('\\', Inside::Quoted) => {
                        i += 1 + rest[1..].chars().next().map_or(0, char::len_utf8);
                        continue;
                    }
                    ('"', Inside::Quoted) => {
                        stack.pop();
                    }
                    _ => {}
                }
            }
        }
        i += c.len_utf8();
    }
    found
}

/// The marker of a heredoc starting at `rest` (`<<EOT` or `<<-EOT`, then the line's end).
fn heredoc_marker(rest: &str) -> Option<String> {
    let after = rest.strip_prefix("<<")?;
    let after = after.strip_prefix('-').unwrap_or(after);
    let line = after.split('\n').next()?.trim_end();
    let is_identifier = !line.is_empty()
        && line
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    is_identifier.then(|| line.to_owned())
}

/// The refusal's message for `keys` in code in the template `template`.
pub fn refusal_message(template: &str, keys: &[String]) -> String {
    let list: Vec<String> = keys.iter().map(|k| format!("${{{k}}}")).collect();
    format!(
        "WorkspaceTemplate {template}: {} stands in code in spec.template.spec.forProvider.module, \
         where a value would be a Terraform expression; put it in a string (\"${{KEY}}\") or \
         pass it as forProvider.vars; nothing is rendered",
        list.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_code(module: &str) -> Vec<String> {
        placeholders_in_code(module, ["NAME", "VERSION"])
    }

    #[test]
    fn a_placeholder_in_a_string_or_a_comment_is_text() {
        for module in [
            "output \"name\" { value = \"${NAME}\" }",
            "output \"name\" { value = \"vpc-${NAME}-x\" }",
            "# cluster ${NAME}\noutput \"x\" { value = 1 }",
            "// cluster ${NAME}",
            "/* cluster\n ${NAME} */ locals {}",
            "locals {\n  a = <<EOT\nname ${NAME}\nEOT\n}",
            "locals {\n  a = <<-EOT\n    name ${NAME}\n    EOT\n}",
            "locals { a = \"escaped \\\" quote ${NAME}\" }",
            "locals { a = \"${var.x == \"y\" ? \"${NAME}\" : \"z\"}\" }",
            "locals { a = \"$${NAME} is literal\" }",
        ] {
            assert_eq!(in_code(module), Vec::<String>::new(), "{module}");
        }
    }

    #[test]
    fn a_placeholder_in_code_is_found() {
        for (module, keys) in [
            ("output \"t\" { value = ${NAME} }", vec!["NAME"]),
            (
                "locals { a = ${NAME}\n b = ${VERSION} c = ${NAME} }",
                vec!["NAME", "VERSION"],
            ),
            // After a string, a comment and a heredoc have ended.
            ("locals { a = \"x\" b = ${NAME} }", vec!["NAME"]),
            ("# x\nlocals { b = ${NAME} }", vec!["NAME"]),
            (
                "locals {\n a = <<EOT\ntext\nEOT\n b = ${VERSION}\n}",
                vec!["VERSION"],
            ),
            // Inside a string's template, code again.
            ("locals { a = \"${upper(${NAME})}\" }", vec!["NAME"]),
            (
                "locals { a = \"%{ if ${NAME} }x%{ endif }\" }",
                vec!["NAME"],
            ),
        ] {
            assert_eq!(in_code(module), keys, "{module}");
        }
    }

    #[test]
    fn placeholders_of_other_keys_and_terraforms_own_templates_are_left_alone() {
        assert_eq!(
            in_code("locals { a = ${var.x} b = \"${local.y}\" c = ${OTHER} }"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn the_message_names_the_template_and_the_placeholders() {
        let message = refusal_message("platform/eks", &["NAME".to_owned()]);
        assert!(message.contains("platform/eks"), "{message}");
        assert!(message.contains("${NAME}"), "{message}");
        assert!(message.contains("forProvider.vars"), "{message}");
    }
}
