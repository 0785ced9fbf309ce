//! The shape of the source tree: modules depend on each other one way only (no import circle),
//! and no source file grows past 1,200 lines.
//!
//! The dependency graph is read from the code itself (comments and `#[cfg(test)]` modules left
//! out): a module depends on another when it names `crate::other…` (top-level modules), or a
//! sibling through `super::sibling…` / `crate::parent::sibling…` (modules of one directory).
//! References to the crate root (`crate::Lease`, the re-exports) are not edges: the root
//! re-exports everything by design.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 1_200;

/// Every `.rs` file under `src/`, with its module path (`lib.rs` is `[]`, `a/mod.rs` is `[a]`,
/// `a/b.rs` is `[a, b]`).
fn source_files() -> Vec<(Vec<String>, PathBuf)> {
    fn walk(dir: &Path, prefix: &[String], out: &mut Vec<(Vec<String>, PathBuf)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("read src/")
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                let mut next = prefix.to_vec();
                next.push(name);
                walk(&path, &next, out);
            } else if let Some(stem) = name.strip_suffix(".rs") {
                let mut module = prefix.to_vec();
                if stem != "mod" && stem != "lib" {
                    module.push(stem.to_owned());
                }
                out.push((module, path));
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &[],
        &mut out,
    );
    out
}

/// The code of a file without comments and without its `#[cfg(test)]` items (test modules may
/// use anything).
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut skip_depth: Option<i64> = None;
    let mut depth = 0i64;
    let mut pending_test = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            continue;
        }
        let code = match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        if trimmed.starts_with("#[cfg(test)]") {
            pending_test = true;
            continue;
        }
        let opens = code.matches('{').count() as i64;
        let closes = code.matches('}').count() as i64;
        if pending_test && skip_depth.is_none() {
            if opens > 0 {
                skip_depth = Some(depth);
            } else if code.trim_end().ends_with(';') {
                // `#[cfg(test)] use …;` or `#[cfg(test)] mod tests;`
                pending_test = false;
                continue;
            }
        }
        depth += opens - closes;
        if let Some(start) = skip_depth {
            if depth <= start {
                skip_depth = None;
                pending_test = false;
            }
            continue;
        }
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The paths a piece of code names after `prefix` (`crate::` or `super::`): the identifiers that
/// follow it, joined by `::`, up to the first that is not a plain path segment.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut segments = Vec::new();
        let mut s = rest;
        loop {
            let end = s
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(s.len());
            if end == 0 {
                break;
            }
            segments.push(s[..end].to_owned());
            match s[end..].strip_prefix("::") {
                Some(next) => s = next,
                None => break,
            }
        }
        if !segments.is_empty() {
            out.push(segments);
        }
    }
    out
}

/// module path → the modules it depends on (both as paths), for the modules of one parent.
type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

fn dependency_graph() -> Graph {
    let files = source_files();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph = Graph::new();
    for (module, path) in &files {
        if module.is_empty() {
            continue; // the crate root re-exports everything
        }
        let code = code_of(&std::fs::read_to_string(path).expect("read source"));
        let edges = graph.entry(module.clone()).or_default();
        let mut add = |target: &[String]| {
            // The longest module that the path starts with: `crate::a::x::Item` names `a::x`
            // when that is a module, else `a`.
            let Some(known) = (1..=target.len())
                .rev()
                .map(|len| target[..len].to_vec())
                .find(|prefix| modules.contains(prefix))
            else {
                return;
            };
            // Itself, one of its ancestors (`super::Item`) or one of its own submodules.
            if known.starts_with(module) || module.starts_with(&known) {
                return;
            }
            edges.insert(known);
        };
        for path in paths_after(&code, "crate::") {
            add(&path);
        }
        let parent = &module[..module.len() - 1];
        for path in paths_after(&code, "super::") {
            let mut full = parent.to_vec();
            full.extend(path);
            add(&full);
        }
    }
    // Fold every module's edges into its ancestors at each level, so that a circle between two
    // directories (`a::x → b`, `b → a`) shows as `a → b → a`.
    let mut folded = Graph::new();
    for (module, targets) in graph {
        for target in targets {
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            folded
                .entry(module[..=common].to_vec())
                .or_default()
                .insert(target[..=common].to_vec());
        }
    }
    folded
}

/// A cycle of the graph, if it has one.
fn find_cycle(graph: &Graph) -> Option<Vec<Vec<String>>> {
    fn visit(
        node: &Vec<String>,
        graph: &Graph,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        state.insert(node.clone(), 1);
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next).copied().unwrap_or(0) {
                1 => {
                    let start = stack.iter().position(|n| n == next).unwrap();
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(cycle) = visit(next, graph, state, stack) {
                        return Some(cycle);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if state.get(node).copied().unwrap_or(0) == 0 {
            if let Some(cycle) = visit(node, graph, &mut state, &mut Vec::new()) {
                return Some(cycle);
            }
        }
    }
    None
}

fn show(cycle: &[Vec<String>]) -> String {
    cycle
        .iter()
        .map(|m| m.join("::"))
        .collect::<Vec<_>>()
        .join(" -> ")
}

#[test]
fn no_module_imports_a_module_that_imports_it() {
    let graph = dependency_graph();
    // The graph is read from the code: the contract and the backend trait are in it.
    assert!(graph[&vec!["lease".to_owned()]].contains(&vec!["settings".to_owned()]));
    assert!(graph[&vec!["backend".to_owned()]].contains(&vec!["settings".to_owned()]));
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import circle in src/: {}", show(&cycle));
    }
}

#[test]
fn the_cycle_finder_finds_cycles_and_reads_paths() {
    let m = |s: &str| s.split("::").map(str::to_owned).collect::<Vec<_>>();
    let mut graph = Graph::new();
    graph.entry(m("lease")).or_default().insert(m("backend"));
    graph.entry(m("backend")).or_default().insert(m("tenure"));
    assert_eq!(find_cycle(&graph), None);
    graph.entry(m("tenure")).or_default().insert(m("lease"));
    let cycle = find_cycle(&graph).expect("a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4, "{}", show(&cycle));

    let code = code_of(
        "use crate::lease::{A, B};\n// use crate::commented::X;\nfn f() { crate::tenure::f(); }\n\
         #[cfg(test)]\nmod tests {\n    use crate::managed::X;\n}\nuse super::sibling::Y;\n",
    );
    assert_eq!(
        paths_after(&code, "crate::"),
        vec![m("lease"), m("tenure::f")]
    );
    assert_eq!(paths_after(&code, "super::"), vec![m("sibling::Y")]);
}

#[test]
fn no_source_file_is_longer_than_1200_lines() {
    let long: Vec<String> = source_files()
        .into_iter()
        .filter_map(|(_, path)| {
            let lines = std::fs::read_to_string(&path).ok()?.lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", path.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines: {long:?}"
    );
}
