//! Every source path that README.md, ARCHITECTURE.md and the Markdown pages
//! under docs/ name must exist in this repository, so a renamed or deleted
//! file cannot leave a document pointing at nothing. Needs no server.
//!
//! A reference is a word of path characters that starts with one of the
//! repository's top-level directories (`src/redis/timer.rs`,
//! `tests/history/`, `.ci/run`) or names a root file (`Makefile`,
//! `Dockerfile.build`, `docker-compose.redlock.yml`, `README.md`). A word
//! glued to other path characters (`/usr/src`, `../docs`, `$PWD/docs`) is
//! not this repository's, and globs never match. A bare file name
//! (`limits.rs`) is checked where its directory is plain: right after a path
//! or another such name in the same table cell (`core/src/args.rs`,
//! `limits.rs`), or in a code block below a line that starts with a
//! directory (the tree in ARCHITECTURE.md).

use std::fs;
use std::path::{Path, PathBuf};

/// The repository's top-level directories.
const TOP_DIRS: &str =
    "src/ core/ client/ clients/ testkit/ tests/ scripts/ docs/ examples/ fuzz/ bench/ docker/ .ci/";

/// The extensions a bare file name is recognised by.
const BARE_EXTENSIONS: [&str; 5] = [".rs", ".sh", ".py", ".js", ".toml"];

/// What a word of a document is.
enum Word<'a> {
    /// A path from the repository root.
    Path(&'a str),
    /// A file name without its directory.
    Bare(&'a str),
    Other,
}

fn classify(word: &str) -> Word<'_> {
    let root_doc = word
        .strip_suffix(".md")
        .is_some_and(|stem| !stem.is_empty() && stem.bytes().all(|b| b.is_ascii_uppercase()));
    let root_file = root_doc
        || word == "Makefile"
        || word == "redis.conf.example"
        || word.starts_with("Dockerfile")
        || (word.starts_with("docker-compose") && word.ends_with(".yml"));
    if root_file || TOP_DIRS.split(' ').any(|dir| word.starts_with(dir)) {
        Word::Path(word)
    } else if !word.contains('/')
        && word.starts_with(|c: char| c.is_ascii_alphanumeric())
        && BARE_EXTENSIONS.iter().any(|ext| word.ends_with(ext))
    {
        Word::Bare(word)
    } else {
        Word::Other
    }
}

/// A subdirectory's name in a tree (`node/`).
fn is_subdir(word: &str) -> bool {
    word.strip_suffix('/').is_some_and(|name| {
        !name.is_empty()
            && !name.contains('/')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// The words of `text` made of path characters, a sentence's full stop cut.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)))
        .map(|word| word.trim_end_matches('.'))
        .filter(|word| !word.is_empty())
}

/// The paths `doc` names: (line, path, whether its directory was inferred).
fn references(doc: &str) -> Vec<(usize, String, bool)> {
    let mut found = Vec::new();
    let mut push = |line, path: String, inferred| found.push((line, path, inferred));
    let mut in_code = false;
    // In a code block (a tree): the directories of the lines above, by
    // indentation: a line starting with a path opens a tree at that path,
    // one starting with a bare `name/` a subdirectory of the line above it
    // that is less indented.
    let mut tree: Vec<(usize, String)> = Vec::new();
    for (index, text) in doc.lines().enumerate() {
        let line = index + 1;
        if text.trim_start().starts_with("```") {
            in_code = !in_code;
            tree.clear();
            continue;
        }
        if in_code {
            let indent = text.len() - text.trim_start().len();
            let first = words(text)
                .next()
                .filter(|w| text.trim_start().starts_with(w));
            match first {
                Some(word) if matches!(classify(word), Word::Path(_)) => {
                    tree.clear();
                    if word.ends_with('/') {
                        tree.push((indent, word.to_string()));
                    }
                }
                Some(word) if is_subdir(word) => {
                    while tree.last().is_some_and(|(at, _)| *at >= indent) {
                        tree.pop();
                    }
                    if let Some((_, dir)) = tree.last() {
                        let sub = format!("{dir}{word}");
                        push(line, sub.clone(), true);
                        tree.push((indent, sub));
                    }
                }
                Some(_) => {
                    // A file line closes the subdirectories it is not in.
                    while tree.len() > 1 && tree.last().is_some_and(|(at, _)| *at >= indent) {
                        tree.pop();
                    }
                }
                None => {}
            }
            let code_dir = tree.last().map(|(_, dir)| dir);
            for word in words(text) {
                match (classify(word), code_dir) {
                    (Word::Path(path), _) => push(line, path.to_string(), false),
                    (Word::Bare(name), Some(dir)) => push(line, format!("{dir}{name}"), true),
                    _ => {}
                }
            }
            continue;
        }
        for cell in text.split('|') {
            // The directory of the word before, if it was a path in one.
            let mut dir: Option<&str> = None;
            for word in words(cell) {
                dir = match classify(word) {
                    Word::Path(path) => {
                        push(line, path.to_string(), false);
                        path.rfind('/').map(|end| &path[..=end])
                    }
                    Word::Bare(name) => {
                        if let Some(dir) = dir {
                            push(line, format!("{dir}{name}"), true);
                        }
                        dir
                    }
                    Word::Other => None,
                };
            }
        }
    }
    found
}

/// Every Markdown file under `dir`, at any depth.
fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry of docs/").path();
        if path.is_dir() {
            markdown_under(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "md") {
            out.push(path);
        }
    }
}

#[test]
fn every_source_path_the_docs_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("CONTRIBUTING.md"),
        root.join("client/README.md"),
        root.join("clients/python/README.md"),
        root.join("clients/node/README.md"),
    ];
    let mut pages = Vec::new();
    markdown_under(&root.join("docs"), &mut pages);
    pages.sort();
    docs.extend(pages);
    let mut missing = Vec::new();
    let (mut checked, mut inferred) = (0, 0);
    for doc in &docs {
        let text =
            fs::read_to_string(doc).unwrap_or_else(|e| panic!("reading {}: {e}", doc.display()));
        let name = doc.strip_prefix(root).unwrap_or(doc).display().to_string();
        for (line, path, bare) in references(&text) {
            checked += 1;
            inferred += usize::from(bare);
            if !root.join(&path).exists() {
                missing.push(format!("{name}:{line}: {path}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} path(s) named in the docs do not exist under {}:\n{}",
        missing.len(),
        root.display(),
        missing.join("\n")
    );
    assert!(
        checked >= 20 && inferred > 0,
        "only {checked} paths found ({inferred} bare file names): is the scanner broken?"
    );
}

/// Every Markdown page of the repository (README, ARCHITECTURE,
/// CONTRIBUTING, the packages' READMEs, docs/).
fn all_pages(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("CONTRIBUTING.md"),
        root.join("client/README.md"),
        root.join("clients/python/README.md"),
        root.join("clients/node/README.md"),
    ];
    let mut pages = Vec::new();
    markdown_under(&root.join("docs"), &mut pages);
    pages.sort();
    docs.extend(pages);
    docs
}

/// Docs say what the code does, and name no machine path (issue 33): no
/// `/root/`, `/home/`, `/work/` or `/tmp/...` of the machine a page was
/// written on; and every relative link (`[text](page.md#anchor)`)
/// points at a file that exists.
#[test]
fn no_page_names_a_machine_path_and_every_relative_link_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bad = Vec::new();
    for doc in all_pages(root) {
        let text = fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(root).unwrap_or(&doc).display().to_string();
        for (n, line) in text.lines().enumerate() {
            for machine in ["/root/", "/home/", "/work/", "/tmp/redis-lock", "/tmp/venv"] {
                if line.contains(machine) {
                    bad.push(format!(
                        "{name}:{}: a machine path ({machine}): {line}",
                        n + 1
                    ));
                }
            }
            let mut rest = line;
            while let Some(at) = rest.find("](") {
                rest = &rest[at + 2..];
                let target = rest.split(')').next().unwrap_or("");
                let file = target.split('#').next().unwrap_or("");
                let external = file.contains("://") || file.starts_with("mailto:");
                if file.is_empty() || external || file.contains(' ') {
                    continue;
                }
                let resolved = doc.parent().unwrap().join(file);
                if !resolved.exists() {
                    bad.push(format!(
                        "{name}:{}: a link to {file}, which does not exist",
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn a_tree_resolves_files_in_its_subdirectories() {
    let tree = "```\n core/src/   the core\n   node/      the node\n     mod.rs   its state\n     handoff.rs, timer.rs\n   lock.rs    a lock\n```\n";
    let paths: Vec<String> = references(tree).into_iter().map(|(_, p, _)| p).collect();
    assert_eq!(
        paths,
        [
            "core/src/",
            "core/src/node/",
            "core/src/node/mod.rs",
            "core/src/node/handoff.rs",
            "core/src/node/timer.rs",
            "core/src/lock.rs"
        ]
    );
}
