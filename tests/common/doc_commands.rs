//! The commands the documentation shows, read from the documents themselves (issue 36): every
//! line of a shell block of README.md (```` ```sh ````, `bash`, `shell`, `console`: its `$ `
//! lines), every inline code span of README.md that starts with `cargo run`, and every line of a
//! command block (```` ```text ````, `sh`, `bash`, `shell`, `console`) in the `//!` header of each
//! `examples/*.rs`. `tests/commands.rs` runs them; a command it does not know how to run fails it.
//!
//! A command keeps where it was found and its block: the commands of one block that run the
//! same example on the same configuration are meant to run together ("start it in several
//! terminals"). A trailing comment `# or FILE.toml` after a command naming `--config
//! .../OTHER.toml` shows a second command, the same with FILE.toml: it is listed too.

use std::collections::BTreeMap;
use std::path::Path;

/// A command as a document shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocCommand {
    /// `README.md:27`, `examples/sharded_node.rs:6`.
    pub source: String,
    /// The block it belongs to: `README.md:20` (the line of the opening fence; an inline span
    /// is a block of its own, named by its line).
    pub block: String,
    /// The command, whitespace-normalised, without its trailing comment.
    pub text: String,
}

const SHELL_BLOCKS: &[&str] = &["sh", "bash", "shell", "console"];
const HEADER_BLOCKS: &[&str] = &["text", "sh", "bash", "shell", "console"];

/// Every command of README.md and of the examples' headers, in document order (README first,
/// then the examples by file name).
pub fn documented_commands(root: &Path) -> Vec<DocCommand> {
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let mut commands = readme_commands("README.md", &readme);
    let mut examples: Vec<_> = std::fs::read_dir(root.join("examples"))
        .expect("examples/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    examples.sort();
    for path in examples {
        let name = format!("examples/{}", path.file_name().unwrap().to_string_lossy());
        let text = std::fs::read_to_string(&path).unwrap();
        commands.extend(header_commands(&name, &text));
    }
    commands
}

/// The commands of a Markdown document: its shell blocks and its inline `cargo run` spans.
pub fn readme_commands(name: &str, text: &str) -> Vec<DocCommand> {
    let mut commands = Vec::new();
    let mut fence: Option<(String, usize)> = None; // (info string, line of the fence)
    let mut prose = String::new(); // text outside fences, with its line numbers kept
    let mut prose_lines = Vec::new(); // the document line of each byte offset's line
    for (i, line) in text.lines().enumerate() {
        let number = i + 1;
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            fence = match fence {
                None => Some((info.trim().to_lowercase(), number)),
                Some(_) => None,
            };
            prose.push('\n');
            prose_lines.push(number);
            continue;
        }
        match &fence {
            Some((info, start)) if SHELL_BLOCKS.contains(&info.as_str()) => {
                let line = if info == "console" {
                    match trimmed.strip_prefix("$ ") {
                        Some(command) => command,
                        None => continue, // output
                    }
                } else {
                    trimmed
                };
                push_line(&mut commands, name, number, *start, line);
            }
            Some(_) => {}
            None => {
                prose.push_str(line);
                prose.push('\n');
                prose_lines.push(number);
            }
        }
    }
    // Inline spans, which may run over a line break.
    let mut line_of_offset = Vec::with_capacity(prose.len());
    for (line, number) in prose.split_inclusive('\n').zip(&prose_lines) {
        line_of_offset.extend(std::iter::repeat_n(*number, line.len()));
    }
    let mut rest = prose.as_str();
    let mut offset = 0;
    while let Some(open) = rest.find('`') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else {
            break;
        };
        let span = after[..close]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if span.starts_with("cargo run") {
            let number = line_of_offset[offset + open];
            commands.push(DocCommand {
                source: format!("{name}:{number}"),
                block: format!("{name}:{number}"),
                text: span,
            });
        }
        let consumed = open + 1 + close + 1;
        rest = &rest[consumed..];
        offset += consumed;
    }
    commands.sort_by_key(|c| line_number(&c.source));
    commands
}

/// The commands of the command blocks of a Rust file's `//!` header.
pub fn header_commands(name: &str, text: &str) -> Vec<DocCommand> {
    let mut commands = Vec::new();
    let mut fence: Option<(String, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let Some(doc) = line.strip_prefix("//!") else {
            break; // the header ends at the first line that is not `//!`
        };
        let number = i + 1;
        let doc = doc.trim_start();
        if let Some(info) = doc.strip_prefix("```") {
            fence = match fence {
                None => Some((info.trim().to_lowercase(), number)),
                Some(_) => None,
            };
            continue;
        }
        if let Some((info, start)) = &fence {
            if HEADER_BLOCKS.contains(&info.as_str()) {
                let line = if info == "console" {
                    match doc.strip_prefix("$ ") {
                        Some(command) => command,
                        None => continue,
                    }
                } else {
                    doc
                };
                push_line(&mut commands, name, number, *start, line);
            }
        }
    }
    assert!(
        fence.is_none(),
        "{name}: a code block of the header never ends"
    );
    commands
}

/// Adds the command of one line of a block (none for a blank or comment line), and the variant
/// its comment shows (`# or kubernetes.toml`).
fn push_line(commands: &mut Vec<DocCommand>, name: &str, number: usize, block: usize, line: &str) {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return;
    }
    assert!(
        !line.ends_with('\\'),
        "{name}:{number}: a command continued on the next line: join it (the test reads one line)"
    );
    let (command, comment) = match line.find(" #") {
        Some(at) => (&line[..at], Some(line[at + 2..].trim())),
        None => (line, None),
    };
    let text = command.split_whitespace().collect::<Vec<_>>().join(" ");
    let block = format!("{name}:{block}");
    let source = format!("{name}:{number}");
    if let Some(other) = comment
        .and_then(|c| c.strip_prefix("or "))
        .filter(|c| c.ends_with(".toml") && !c.contains(char::is_whitespace))
    {
        let words: Vec<&str> = text.split_whitespace().collect();
        let config = words
            .iter()
            .position(|w| *w == "--config")
            .and_then(|i| words.get(i + 1))
            .unwrap_or_else(|| {
                panic!(
                    "{source}: the comment names another configuration ({other}), the command none"
                )
            });
        let dir = config.rsplit_once('/').map_or("", |(dir, _)| dir);
        let variant = if dir.is_empty() {
            other.to_owned()
        } else {
            format!("{dir}/{other}")
        };
        commands.push(DocCommand {
            source: source.clone(),
            block: block.clone(),
            text: text.clone(),
        });
        commands.push(DocCommand {
            source: format!("{source} (its comment: `or {other}`)"),
            block: format!("{block} (or {other})"),
            text: text.replace(
                &format!("--config {config}"),
                &format!("--config {variant}"),
            ),
        });
        return;
    }
    commands.push(DocCommand {
        source,
        block,
        text,
    });
}

fn line_number(source: &str) -> usize {
    let (_, rest) = source.split_once(':').unwrap_or_default();
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..digits].parse().unwrap_or(0)
}

/// A `cargo run` command, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CargoRun {
    /// `--all-features`.
    pub all_features: bool,
    /// `--features a,b` (`-F`), in order.
    pub features: Vec<String>,
    /// `--example NAME`.
    pub example: String,
    /// Everything after `--`.
    pub args: Vec<String>,
}

impl CargoRun {
    /// Parses `cargo run [--features F | -F F | --all-features] --example NAME [-- ARGS]`;
    /// `None` for a command that is not `cargo run`; an error for a `cargo run` with a flag this
    /// parser does not know (so that a new kind of command is noticed, not misread).
    pub fn parse(text: &str) -> Option<Result<Self, String>> {
        let words: Vec<&str> = text.split_whitespace().collect();
        if words.get(..2) != Some(&["cargo", "run"][..]) {
            return None;
        }
        if text.contains(['"', '\'', '$', '`', '|', '&', ';', '<', '>']) {
            return Some(Err(format!(
                "`{text}`: quotes, variables, pipes and redirections are not handled"
            )));
        }
        let (cargo, args) = match words.iter().position(|w| *w == "--") {
            Some(at) => (&words[2..at], &words[at + 1..]),
            None => (&words[2..], &[][..]),
        };
        let mut run = CargoRun {
            all_features: false,
            features: Vec::new(),
            example: String::new(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        let mut cargo = cargo.iter();
        while let Some(flag) = cargo.next() {
            match *flag {
                "--all-features" => run.all_features = true,
                "--features" | "-F" => match cargo.next() {
                    Some(list) => run.features.extend(
                        list.split([',', ' '])
                            .filter(|f| !f.is_empty())
                            .map(str::to_owned),
                    ),
                    None => return Some(Err(format!("`{text}`: {flag} without a value"))),
                },
                "--example" => match cargo.next() {
                    Some(name) => run.example = (*name).to_owned(),
                    None => return Some(Err(format!("`{text}`: --example without a value"))),
                },
                other => {
                    return Some(Err(format!(
                        "`{text}`: the cargo flag {other} is not handled by tests/commands.rs"
                    )))
                }
            }
        }
        if run.example.is_empty() {
            return Some(Err(format!(
                "`{text}`: not an example (tests/commands.rs runs examples only)"
            )));
        }
        Some(Ok(run))
    }

    /// The value of `--flag` among the example's arguments.
    pub fn arg(&self, flag: &str) -> Option<&str> {
        let at = self.args.iter().position(|a| a == flag)?;
        self.args.get(at + 1).map(String::as_str)
    }

    /// Whether the build the command asks for has `feature` on.
    pub fn has_feature(&self, feature: &str) -> bool {
        self.all_features || self.features.iter().any(|f| f == feature)
    }
}

/// The `required-features` of every `[[example]]` of Cargo.toml that has some.
pub fn required_features(root: &Path) -> BTreeMap<String, Vec<String>> {
    let manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let mut required = BTreeMap::new();
    for example in manifest
        .get("example")
        .and_then(|e| e.as_array())
        .into_iter()
        .flatten()
    {
        let name = example["name"].as_str().unwrap().to_owned();
        let features = example
            .get("required-features")
            .and_then(|f| f.as_array())
            .map(|f| f.iter().map(|f| f.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default();
        required.insert(name, features);
    }
    required
}

/// Checks of the reader itself, on made-up documents (called by `tests/commands.rs`).
pub fn self_check() {
    let readme = "intro `cargo run --example a` and\n`cargo run --features x\n--example b -- --k v`\n\
                  ```sh\n# comment\ncargo run --example c   # in-memory\ncargo run --example d -- --config examples/e.toml   # or f.toml\n```\n\
                  ```rust\ncargo run --example not-a-command\n```\n\
                  ```console\n$ cargo run --example g\noutput line\n```\n";
    let found: Vec<(String, String, String)> = readme_commands("R", readme)
        .into_iter()
        .map(|c| (c.source, c.block, c.text))
        .collect();
    let expected = [
        ("R:1", "R:1", "cargo run --example a"),
        ("R:2", "R:2", "cargo run --features x --example b -- --k v"),
        ("R:6", "R:4", "cargo run --example c"),
        (
            "R:7",
            "R:4",
            "cargo run --example d -- --config examples/e.toml",
        ),
        (
            "R:7 (its comment: `or f.toml`)",
            "R:4 (or f.toml)",
            "cargo run --example d -- --config examples/f.toml",
        ),
        ("R:13", "R:12", "cargo run --example g"),
    ];
    let expected: Vec<(String, String, String)> = expected
        .iter()
        .map(|(a, b, c)| ((*a).into(), (*b).into(), (*c).into()))
        .collect();
    assert_eq!(found, expected);
    let header = "//! A demo.\n//!\n//! ```text\n//! # a comment\n//! cargo run --example h -- --x 1\n//! ```\n//!\n//! ```\n//! let rust = 1;\n//! ```\n\nfn main() {}\n//! ```text\n//! cargo run --example after-the-header\n//! ```\n";
    let found: Vec<String> = header_commands("E", header)
        .into_iter()
        .map(|c| format!("{} {} {}", c.source, c.block, c.text))
        .collect();
    assert_eq!(found, ["E:5 E:3 cargo run --example h -- --x 1"]);
    let run = CargoRun::parse("cargo run --features metrics,web --example w -- --listen 1:2")
        .unwrap()
        .unwrap();
    assert_eq!(run.features, ["metrics", "web"]);
    assert_eq!(run.example, "w");
    assert_eq!(run.arg("--listen"), Some("1:2"));
    assert!(run.has_feature("web") && !run.has_feature("etcd"));
    assert!(CargoRun::parse("scripts/test.sh").is_none());
    assert!(CargoRun::parse("cargo run --release --example w")
        .unwrap()
        .is_err());
    assert!(CargoRun::parse("cargo run --example w -- --owner \"$X\"")
        .unwrap()
        .is_err());
}
