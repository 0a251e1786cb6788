//! The modules of the runtime, the macros and the benchmark import each other without cycles: an import graph of the crate's own
//! source files (one node per file), built from every `use` and every inline `crate::…`,
//! `super::…` and `self::…` path, with re-exports followed to the file that defines the item.
//!
//! A cycle means two layers each need the other — the engine trait importing the backend handle
//! that holds engines, say — and this test names the files and the lines that close it.

mod source;

use source::rust_files;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// A module path from the crate root, e.g. `["backend", "builder"]`.
type ModPath = Vec<String>;

struct Source {
    file: PathBuf,
    module: ModPath,
    /// (line, inline module it is written in (`mod tests { … }`), path as written, is a
    /// re-export).
    paths: Vec<(usize, ModPath, Vec<String>, bool)>,
    /// Re-exported name → the path it re-exports.
    reexports: HashMap<String, Vec<String>>,
}

/// The module a file is, by the usual layout (`a/mod.rs` and `a.rs` are `a`).
fn module_of(src: &Path, file: &Path) -> ModPath {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: ModPath = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Code without comments, and without the contents of string and char literals.
fn code_of(text: &str) -> Vec<String> {
    text.lines()
        .map(|line| {
            let mut out = String::new();
            let mut chars = line.chars().peekable();
            let mut in_string = false;
            while let Some(c) = chars.next() {
                if in_string {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => in_string = false,
                        _ => {}
                    }
                    continue;
                }
                match c {
                    '"' => {
                        in_string = true;
                        out.push('"');
                    }
                    '/' if chars.peek() == Some(&'/') => break,
                    _ => out.push(c),
                }
            }
            out
        })
        .collect()
}

/// Expands `a::{b, c::{d, e}}` into `a::b`, `a::c::d`, `a::c::e`.
fn expand_use(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = format!("{prefix}{}", &tree[..open]);
        let inner = &tree[open + 1..tree.rfind('}').unwrap()];
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_use(&inner[start..i], &head, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand_use(&inner[start..], &head, out);
    } else if !tree.is_empty() {
        let path = tree.split(" as ").next().unwrap().trim();
        out.push(format!("{prefix}{path}"));
    }
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

fn parse(src: &Path, file: &Path, path_attrs: &HashMap<PathBuf, ModPath>) -> Source {
    let text = std::fs::read_to_string(file).unwrap();
    let lines = code_of(&text);
    let module = path_attrs
        .get(file)
        .cloned()
        .unwrap_or_else(|| module_of(src, file));
    let mut paths = Vec::new();
    let mut reexports = HashMap::new();
    let joined: Vec<(usize, &str)> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| (i + 1, l.as_str()))
        .collect();
    // Inline modules (`mod tests {`) open here, with the brace depth they close at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < joined.len() {
        let (number, line) = joined[i];
        let trimmed = line.trim_start();
        let opens = trimmed
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ")
            .strip_prefix("mod ")
            .and_then(|rest| rest.trim_end().strip_suffix('{'))
            .map(|name| name.trim().to_owned());
        if let Some(name) = opens {
            inline.push((name, depth));
        }
        depth += line.matches('{').count();
        depth = depth.saturating_sub(line.matches('}').count());
        while inline.last().is_some_and(|(_, open)| depth <= *open) {
            inline.pop();
        }
        let within: ModPath = inline.iter().map(|(name, _)| name.clone()).collect();
        let is_use = trimmed.starts_with("use ")
            || (trimmed.starts_with("pub") && trimmed.contains(" use "));
        if is_use {
            let mut statement = String::from(line);
            while !statement.contains(';') && i + 1 < joined.len() {
                i += 1;
                statement.push_str(joined[i].1);
            }
            let public = statement.trim_start().starts_with("pub");
            let tree = statement[statement.find("use ").unwrap() + 4..statement.find(';').unwrap()]
                .to_owned();
            let mut expanded = Vec::new();
            expand_use(&tree, "", &mut expanded);
            for written in expanded {
                let parts = segments(&written);
                if public {
                    let name = written
                        .split(" as ")
                        .nth(1)
                        .map(|alias| alias.trim().to_owned())
                        .unwrap_or_else(|| parts.last().unwrap().clone());
                    reexports.insert(name, parts.clone());
                }
                paths.push((number, within.clone(), parts, public));
            }
        } else {
            // Inline paths in code: `crate::key::validate(…)`, `super::Timeouts`.
            let bytes = line.as_bytes();
            for start in ["crate::", "super::", "self::"] {
                let mut from = 0;
                while let Some(found) = line[from..].find(start) {
                    let at = from + found;
                    from = at + start.len();
                    if at > 0
                        && (bytes[at - 1].is_ascii_alphanumeric()
                            || bytes[at - 1] == b'_'
                            || bytes[at - 1] == b':')
                    {
                        continue;
                    }
                    let end = line[at..]
                        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                        .map_or(line.len(), |len| at + len);
                    paths.push((number, within.clone(), segments(&line[at..end]), false));
                }
            }
        }
        i += 1;
    }
    Source {
        file: file.to_owned(),
        module,
        paths,
        reexports,
    }
}

struct Crate {
    sources: Vec<Source>,
    by_module: BTreeMap<ModPath, usize>,
}

impl Crate {
    /// The file defining what `path`, written in `from`, names.
    fn resolve(&self, from: &ModPath, path: &[String], depth: usize) -> Option<usize> {
        if depth > 16 || path.is_empty() {
            return None;
        }
        let mut absolute: ModPath = Vec::new();
        let mut rest = path;
        match path[0].as_str() {
            "crate" => rest = &path[1..],
            "super" | "self" => {
                absolute = from.clone();
                while let Some(first) = rest.first() {
                    match first.as_str() {
                        "super" => {
                            absolute.pop();
                        }
                        "self" => {}
                        _ => break,
                    }
                    rest = &rest[1..];
                }
            }
            first => {
                // `use child::Item` names a child module of the current one; anything else is
                // another crate.
                let mut child = from.clone();
                child.push(first.to_owned());
                if !self.by_module.contains_key(&child) {
                    return None;
                }
                absolute = from.clone();
            }
        }
        // Descend while the next segment is a module that has a file.
        let mut module = absolute;
        let mut tail = rest;
        while let Some(next) = tail.first() {
            let mut deeper = module.clone();
            deeper.push(next.clone());
            if self.by_module.contains_key(&deeper) {
                module = deeper;
                tail = &tail[1..];
            } else {
                break;
            }
        }
        let index = *self.by_module.get(&module)?;
        // An item re-exported by that module is defined where the re-export points.
        if let Some(item) = tail.first() {
            if let Some(target) = self.sources[index].reexports.get(item) {
                let mut target = target.clone();
                target.extend(tail[1..].iter().cloned());
                if let Some(found) = self.resolve(&module, &target, depth + 1) {
                    return Some(found);
                }
            }
        }
        Some(index)
    }
}

/// Tarjan's strongly connected components.
fn components(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        found: Vec<Vec<usize>>,
    }
    fn visit(state: &mut State<'_>, node: usize) {
        state.index[node] = Some(state.next);
        state.low[node] = state.next;
        state.next += 1;
        state.stack.push(node);
        state.on_stack[node] = true;
        for &next in state.edges[node].clone().iter() {
            match state.index[next] {
                None => {
                    visit(state, next);
                    state.low[node] = state.low[node].min(state.low[next]);
                }
                Some(index) if state.on_stack[next] => {
                    state.low[node] = state.low[node].min(index);
                }
                Some(_) => {}
            }
        }
        if Some(state.low[node]) == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack[member] = false;
                component.push(member);
                if member == node {
                    break;
                }
            }
            state.found.push(component);
        }
    }
    let n = edges.len();
    let mut state = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in 0..n {
        if state.index[node].is_none() {
            visit(&mut state, node);
        }
    }
    state.found
}

#[test]
fn the_runtime_has_no_module_cycles() {
    assert_no_cycles("runtime", "lib.rs");
}

#[test]
fn the_macros_have_no_module_cycles() {
    assert_no_cycles("macros", "lib.rs");
}

#[test]
fn the_benchmark_has_no_module_cycles() {
    assert_no_cycles("bench", "main.rs");
}

/// Asserts that the crate in the workspace folder `krate`, whose root file is `root`, has no
/// module cycles.
fn assert_no_cycles(krate: &str, root: &str) {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let src = workspace.join(krate).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    // `#[path = "x.rs"] mod y;` in the crate root.
    let mut path_attrs = HashMap::new();
    let root = std::fs::read_to_string(src.join(root)).unwrap();
    let root_lines: Vec<&str> = root.lines().collect();
    for (i, line) in root_lines.iter().enumerate() {
        if let Some(rest) = line.trim().strip_prefix("#[path = \"") {
            let file = src.join(&rest[..rest.find('"').unwrap()]);
            let declaration = root_lines[i + 1..]
                .iter()
                .find(|line| line.contains("mod "))
                .unwrap();
            let name = declaration
                .split("mod ")
                .nth(1)
                .unwrap()
                .trim_end_matches(';')
                .trim();
            path_attrs.insert(file, vec![name.to_owned()]);
        }
    }
    let sources: Vec<Source> = files
        .iter()
        .map(|file| parse(&src, file, &path_attrs))
        .collect();
    let by_module = sources
        .iter()
        .enumerate()
        .map(|(i, source)| (source.module.clone(), i))
        .collect();
    let krate_name = krate;
    let krate = Crate { sources, by_module };
    let mut edges = vec![BTreeSet::new(); krate.sources.len()];
    let mut why: BTreeMap<(usize, usize), String> = BTreeMap::new();
    for (from, source) in krate.sources.iter().enumerate() {
        for (line, within, path, reexport) in &source.paths {
            // A re-export is how a parent shows its children's items, not a dependency of the
            // parent's own code; it is followed when resolving, above.
            if *reexport {
                continue;
            }
            let mut module = source.module.clone();
            module.extend(within.iter().cloned());
            if let Some(to) = krate.resolve(&module, path, 0) {
                if to != from {
                    edges[from].insert(to);
                    why.entry((from, to)).or_insert_with(|| {
                        format!(
                            "{}:{line} uses {}",
                            source.file.strip_prefix(&src).unwrap().display(),
                            path.join("::")
                        )
                    });
                }
            }
        }
    }
    let edge_count: usize = edges.iter().map(BTreeSet::len).sum();
    assert!(
        edge_count > krate.sources.len(),
        "the parser found almost no imports ({edge_count} edges for {} files): the test is broken",
        krate.sources.len()
    );
    let cycles: Vec<Vec<usize>> = components(&edges)
        .into_iter()
        .filter(|component| component.len() > 1)
        .collect();
    let mut report = String::new();
    for cycle in &cycles {
        let members: BTreeSet<usize> = cycle.iter().copied().collect();
        report.push_str("cycle among:\n");
        for &member in &members {
            for &to in &edges[member] {
                if members.contains(&to) {
                    report.push_str(&format!("  {}\n", why[&(member, to)]));
                }
            }
        }
    }
    eprintln!(
        "MODULES {krate_name}: {} files, {edge_count} import edges, {} cycles",
        krate.sources.len(),
        cycles.len()
    );
    assert!(cycles.is_empty(), "module cycles:\n{report}");
}
