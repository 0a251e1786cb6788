//! What the published packages show their readers: crates.io pages whose links work there,
//! package metadata that is all there, and docs.rs labels on every item behind a feature.
//!
//! `cargo package` (run by `.ci/run`) checks that the packages build from what they contain;
//! these checks cover what it does not.

mod source;

use source::rust_files;
use std::path::{Path, PathBuf};

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The published packages: directory, readme as its `Cargo.toml` names it.
const PUBLISHED: [(&str, &str); 3] = [
    ("runtime", "../README.md"),
    ("macros", "README.md"),
    ("cli", "README.md"),
];

/// Every link target in a markdown text: inline `[text](target)` and reference `[label]: target`.
fn link_targets(markdown: &str) -> Vec<(usize, String)> {
    let mut targets = Vec::new();
    for (index, line) in markdown.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            targets.push((index + 1, after[..end].to_string()));
            rest = &after[end..];
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            if let Some(at) = trimmed.find("]: ") {
                targets.push((index + 1, trimmed[at + 3..].trim().to_string()));
            }
        }
    }
    targets
}

/// crates.io renders a README without a repository to resolve relative links against: a link
/// must be absolute or an anchor in the page.
#[test]
fn readmes_link_only_to_what_works_on_crates_io() {
    let mut relative = Vec::new();
    for (dir, readme) in PUBLISHED {
        let path = root().join(dir).join(readme);
        let text = std::fs::read_to_string(&path).unwrap();
        for (line, target) in link_targets(&text) {
            let absolute = target.starts_with("https://") || target.starts_with("http://");
            if !absolute && !target.starts_with('#') {
                relative.push(format!("{}:{line}: {target}", path.display()));
            }
        }
    }
    assert!(
        relative.is_empty(),
        "relative links, which lead nowhere on crates.io:\n{}",
        relative.join("\n")
    );
}

#[test]
fn link_targets_are_found_inline_and_by_reference() {
    let found = link_targets("see [a](https://x.io/a) and [b](docs/b.md)\n[k]: https://k.io\n");
    let targets: Vec<&str> = found.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(targets, ["https://x.io/a", "docs/b.md", "https://k.io"]);
}

/// The fields crates.io and docs.rs show, on each published package.
#[test]
fn published_packages_carry_their_metadata() {
    let mut missing = Vec::new();
    for (dir, readme) in PUBLISHED {
        let manifest = std::fs::read_to_string(root().join(dir).join("Cargo.toml")).unwrap();
        let fields = [
            "description = ",
            "license.workspace = true",
            "rust-version.workspace = true",
            "documentation = ",
            "keywords = ",
            "categories = ",
        ];
        for field in fields {
            if !manifest.contains(field) {
                missing.push(format!("{dir}/Cargo.toml: {field}…"));
            }
        }
        if !manifest.contains(&format!("readme = \"{readme}\"")) {
            missing.push(format!("{dir}/Cargo.toml: readme = \"{readme}\""));
        }
        for licence in ["LICENSE-MIT", "LICENSE-APACHE"] {
            let copy = std::fs::read_to_string(root().join(dir).join(licence)).unwrap_or_default();
            let original = std::fs::read_to_string(root().join(licence)).unwrap();
            if copy != original {
                missing.push(format!(
                    "{dir}/{licence}: the root's licence (a symlink to it)"
                ));
            }
        }
    }
    let workspace = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    if workspace.contains("example.invalid") || workspace.contains("\nrepository") {
        missing.push("Cargo.toml: a `repository` before the project has one".to_string());
    }
    assert!(missing.is_empty(), "missing:\n{}", missing.join("\n"));
}

/// Public items behind `#[cfg(feature = "…")]` (items, re-exports and trait impls) whose
/// attributes lack the matching `#[cfg_attr(docsrs, doc(cfg(feature = "…")))]`: their lines.
/// Internal features (a leading `_`) are not shown on docs.rs and need no label.
fn unlabelled_feature_items(source: &str) -> Vec<usize> {
    let lines: Vec<&str> = source.lines().map(str::trim).collect();
    let mut unlabelled = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let Some(feature) = line
            .strip_prefix("#[cfg(feature = \"")
            .and_then(|rest| rest.strip_suffix("\")]"))
        else {
            continue;
        };
        if feature.starts_with('_') {
            continue; // internal: not on docs.rs at all
        }
        let attributes = |line: &&&str| line.starts_with("#[") || line.starts_with("///");
        let before = lines[..index].iter().rev().take_while(attributes);
        let after = lines[index + 1..].iter().take_while(attributes);
        let item = lines[index + 1..].iter().find(|line| !attributes(line));
        let public = item.is_some_and(|item| {
            item.starts_with("pub ") || item.starts_with("impl ") || item.starts_with("impl<")
        });
        let label = format!("#[cfg_attr(docsrs, doc(cfg(feature = \"{feature}\")))]");
        if public && !before.chain(after).any(|line| *line == label) {
            unlabelled.push(index + 1);
        }
    }
    unlabelled
}

#[test]
fn feature_gated_public_items_say_their_feature_on_docs_rs() {
    let mut files = Vec::new();
    rust_files(&root().join("runtime/src"), &mut files);
    let mut unlabelled = Vec::new();
    for file in files {
        let source = std::fs::read_to_string(&file).unwrap();
        for line in unlabelled_feature_items(&source) {
            unlabelled.push(format!("{}:{line}", file.display()));
        }
    }
    assert!(
        unlabelled.is_empty(),
        "public items behind a feature without #[cfg_attr(docsrs, doc(cfg(feature = …)))]:\n{}",
        unlabelled.join("\n")
    );
}

#[test]
fn an_unlabelled_feature_item_is_found() {
    let source = "#[cfg(feature = \"tls\")]\npub fn a() {}\n\
                  #[cfg(feature = \"tls\")]\n#[cfg_attr(docsrs, doc(cfg(feature = \"tls\")))]\npub fn b() {}\n\
                  #[cfg(feature = \"tls\")]\nfn private() {}\n\
                  #[cfg(feature = \"tls\")]\nimpl From<A> for B {}\n\
                  #[cfg(feature = \"__internal\")]\npub mod raw {}\n";
    assert_eq!(unlabelled_feature_items(source), [1, 8]);
}
