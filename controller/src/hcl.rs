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
    keys: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let mut scanner = Scanner {
        placeholders: keys.into_iter().map(|key| format!("${{{key}}}")).collect(),
        stack: vec![Inside::Code {
            template: false,
            braces: 0,
        }],
        line_start: true,
        found: Vec::new(),
    };
    let mut i = 0;
    while i < module.len() {
        i += scanner.step(&module[i..]);
    }
    scanner.found
}

/// The scanner between two steps.
struct Scanner {
    /// `${KEY}` for each key looked for.
    placeholders: Vec<String>,
    /// What it is inside of, innermost last; the module's code is never left.
    stack: Vec<Inside>,
    /// Whether the next character starts a line.
    line_start: bool,
    /// The keys found in code, each once, in the order found.
    found: Vec<String>,
}

impl Scanner {
    /// The placeholder `rest` starts with, if any.
    fn placeholder_at(&self, rest: &str) -> Option<&str> {
        self.placeholders
            .iter()
            .map(String::as_str)
            .find(|p| rest.starts_with(p))
    }

    /// Reads what `rest` (not empty) starts with; answers how many bytes it took.
    fn step(&mut self, rest: &str) -> usize {
        let c = rest.chars().next().expect("not at the end");
        let at_line_start = std::mem::replace(&mut self.line_start, c == '\n');
        match self.stack.last() {
            Some(Inside::Code { .. }) => self.step_in_code(rest, c),
            _ => self.step_in_text(rest, c, at_line_start),
        }
    }

    /// A step in code: a placeholder found, a comment skipped, a heredoc or a string
    /// entered, a brace counted, or a template's code left.
    fn step_in_code(&mut self, rest: &str, c: char) -> usize {
        if let Some(p) = self.placeholder_at(rest) {
            let (len, key) = (p.len(), p[2..p.len() - 1].to_owned());
            if !self.found.contains(&key) {
                self.found.push(key);
            }
            return len;
        }
        if rest.starts_with('#') || rest.starts_with("//") {
            return rest.find('\n').unwrap_or(rest.len());
        }
        if rest.starts_with("/*") {
            return rest.find("*/").map_or(rest.len(), |end| end + 2);
        }
        if let Some(marker) = heredoc_marker(rest) {
            self.line_start = true;
            self.stack.push(Inside::Heredoc { marker });
            return rest.find('\n').map_or(rest.len(), |end| end + 1);
        }
        let Some(Inside::Code { template, braces }) = self.stack.last_mut() else {
            unreachable!("a step in code")
        };
        match c {
            '"' => self.stack.push(Inside::Quoted),
            '{' => *braces += 1,
            '}' if *template && *braces == 0 => {
                self.stack.pop();
            }
            '}' => *braces = braces.saturating_sub(1),
            _ => {}
        }
        c.len_utf8()
    }

    /// A step in a string literal (quoted or a heredoc): its end, a placeholder (text: the
    /// value stays a value), an escape, or a template's code entered.
    fn step_in_text(&mut self, rest: &str, c: char, at_line_start: bool) -> usize {
        if let Some(Inside::Heredoc { marker }) = self.stack.last()
            && at_line_start
            && rest.lines().next().map(str::trim) == Some(marker.as_str())
        {
            self.stack.pop();
            self.line_start = true;
            return rest.find('\n').map_or(rest.len(), |end| end + 1);
        }
        if let Some(p) = self.placeholder_at(rest) {
            return p.len();
        }
        if rest.starts_with("$${") || rest.starts_with("%%{") {
            return 3;
        }
        if rest.starts_with("${") || rest.starts_with("%{") {
            self.stack.push(Inside::Code {
                template: true,
                braces: 0,
            });
            return 2;
        }
        let quoted = self.stack.last() == Some(&Inside::Quoted);
        match c {
            '\\' if quoted => return 1 + rest[1..].chars().next().map_or(0, char::len_utf8),
            '"' if quoted => {
                self.stack.pop();
            }
            _ => {}
        }
        c.len_utf8()
    }
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
