//! The working tree as content, for the optimisation loop: every file git lists
//! (tracked, and untracked but not ignored) outside the loop's own output
//! (`perf/`) and the target dir, hashed, its bytes kept in a content-addressed
//! store. Symlinks are entries of their own (their target text), never read
//! through, so nothing outside the tree is hashed, and a revert never writes
//! through one.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::tools::process::{Cmd, write_atomic};

/// Folders of the tree that are the loop's own record, not part of what it measures.
pub const EXCLUDED: &[&str] = &["perf/"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Node {
    File { sha256: String, executable: bool },
    Link { target: String },
}

/// Relative path (`/`-separated) → entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tree {
    pub nodes: BTreeMap<String, Node>,
}

impl Tree {
    /// One hash of every path and entry: equal trees, equal hashes.
    pub fn hash(&self) -> String {
        let mut h = Sha256::new();
        for (path, node) in &self.nodes {
            let line = match node {
                Node::File { sha256, executable } => format!("file {} {sha256} {path}\0", u8::from(*executable)),
                Node::Link { target } => format!("link {target}\0{path}\0"),
            };
            h.update(line.as_bytes());
        }
        hex(&h.finalize())
    }

    /// Paths whose entries differ between the two trees.
    pub fn moved(&self, other: &Tree) -> Vec<String> {
        diff(self, other).into_iter().map(|c| c.path().to_string()).collect()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// How a path of the candidate differs from the base.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    Modified(String),
    Added(String),
    Deleted(String),
}

impl Change {
    pub fn path(&self) -> &str {
        match self {
            Change::Modified(p) | Change::Added(p) | Change::Deleted(p) => p,
        }
    }
}

/// Every path whose entry differs, in path order.
pub fn diff(base: &Tree, cand: &Tree) -> Vec<Change> {
    let paths: BTreeSet<&String> = base.nodes.keys().chain(cand.nodes.keys()).collect();
    paths
        .into_iter()
        .filter_map(|p| match (base.nodes.get(p), cand.nodes.get(p)) {
            (Some(a), Some(b)) if a != b => Some(Change::Modified(p.clone())),
            (None, Some(_)) => Some(Change::Added(p.clone())),
            (Some(_), None) => Some(Change::Deleted(p.clone())),
            _ => None,
        })
        .collect()
}

/// Content-addressed bytes: `DIR/<sha256>`.
#[derive(Debug, Clone)]
pub struct Store {
    pub dir: PathBuf,
}

impl Store {
    pub fn new(dir: PathBuf) -> Store {
        Store { dir }
    }

    fn put(&self, bytes: &[u8]) -> Result<String> {
        let sha = sha256(bytes);
        let path = self.dir.join(&sha);
        if !path.is_file() {
            std::fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))?;
            write_atomic(&path, bytes, false)?;
        }
        Ok(sha)
    }

    pub fn get(&self, sha: &str) -> Result<Vec<u8>> {
        let path = self.dir.join(sha);
        let bytes = fa_schema::file::read(&path)?;
        if sha256(&bytes) != sha {
            bail!("{} does not hold what its name says: the accepted snapshot is damaged", path.display());
        }
        Ok(bytes)
    }

    /// Deletes every object no tree in `keep` refers to.
    pub fn retain(&self, keep: &[&Tree]) -> Result<()> {
        let wanted: BTreeSet<&str> = keep
            .iter()
            .flat_map(|t| t.nodes.values())
            .filter_map(|n| match n {
                Node::File { sha256, .. } => Some(sha256.as_str()),
                Node::Link { .. } => None,
            })
            .collect();
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Ok(()) };
        for e in entries {
            let e = e.with_context(|| format!("listing {}", self.dir.display()))?;
            let name = e.file_name();
            if !wanted.contains(name.to_string_lossy().as_ref()) {
                std::fs::remove_file(e.path()).with_context(|| format!("removing {}", e.path().display()))?;
            }
        }
        Ok(())
    }
}

/// Reads every listed file of `root` (see the module comment), puts its bytes in
/// `store` and returns the tree. `exclude` adds relative folder prefixes (`x/`).
pub fn scan(root: &Path, store: &Store, exclude: &[String]) -> Result<Tree> {
    let mut tree = Tree::default();
    for rel in list(root)? {
        if EXCLUDED.iter().any(|x| rel.starts_with(x)) || exclude.iter().any(|x| rel.starts_with(x.as_str())) {
            continue;
        }
        if let Some(node) = read_node(root, &rel, Some(store))? {
            tree.nodes.insert(rel, node);
        }
    }
    Ok(tree)
}

/// The entry at `root/rel` now (None where nothing is there); its bytes go to `store` if given.
fn read_node(root: &Path, rel: &str, store: Option<&Store>) -> Result<Option<Node>> {
    let path = root.join(rel);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        // A tracked file the work tree deleted.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(&path).with_context(|| format!("reading the link {}", path.display()))?;
        let Some(target) = target.to_str() else { bail!("{}: a link target that is not UTF-8", path.display()) };
        return Ok(Some(Node::Link { target: target.to_string() }));
    }
    if !meta.is_file() {
        return Ok(None);
    }
    let bytes = fa_schema::file::read(&path)?;
    let sha256 = match store {
        Some(s) => s.put(&bytes)?,
        None => sha256(&bytes),
    };
    Ok(Some(Node::File { sha256, executable: meta.permissions().mode() & 0o111 != 0 }))
}

/// The tree's files: `git ls-files` where `root` is a git work tree; else (a copy
/// without `.git`) every file under it but `.git/` and `target/`.
fn list(root: &Path) -> Result<Vec<String>> {
    let out = Cmd::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--full-name"])
        .cwd(root)
        .quiet()
        .run();
    match out {
        Ok(o) if o.success() => {
            let mut paths: Vec<String> = o.stdout.split('\0').filter(|p| !p.is_empty()).map(String::from).collect();
            paths.sort();
            paths.dedup(); // a conflicted file is listed once per stage
            Ok(paths)
        }
        _ => walk(root),
    }
}

fn walk(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let e = e.with_context(|| format!("listing {}", dir.display()))?;
            let r = rel.join(e.file_name());
            let Some(s) = r.to_str() else { bail!("{}: a path that is not UTF-8", root.join(&r).display()) };
            if s == ".git" || s == "target" {
                continue;
            }
            if e.file_type().with_context(|| format!("reading {}", e.path().display()))?.is_dir() {
                stack.push(r);
            } else {
                out.push(s.to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `rel` is a plain relative path and no folder on the way to it from `root` is
/// a symlink: writing there stays inside the tree.
fn check_inside(root: &Path, rel: &str) -> Result<PathBuf> {
    let p = Path::new(rel);
    if rel.is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        bail!("`{rel}` is not a plain path inside the repository");
    }
    let mut dir = root.to_path_buf();
    for c in p.parent().into_iter().flat_map(Path::components) {
        dir.push(c);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_symlink() => {
                bail!("{} is a symlink: not writing through it (revert {rel} by hand)", dir.display())
            }
            Ok(m) if !m.is_dir() => bail!("{} is not a folder (revert {rel} by hand)", dir.display()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        }
    }
    Ok(root.join(p))
}

/// Puts `base`'s entry back at every changed path (a path the base lacks is
/// removed; its content stays in the attempt's patch). Touches nothing else.
/// Refuses, before writing anything, if a changed path no longer holds `cand`'s
/// entry (someone edited it since it was measured) or lies behind a symlink.
pub fn revert(root: &Path, store: &Store, base: &Tree, cand: &Tree, changes: &[Change]) -> Result<()> {
    for c in changes {
        let p = c.path();
        if read_node(root, p, None)? != cand.nodes.get(p).cloned() {
            bail!("{p} changed after it was measured: nothing reverted; revert the attempt by hand");
        }
    }
    for c in changes {
        let p = c.path();
        let path = check_inside(root, p)?;
        match base.nodes.get(p) {
            Some(Node::File { sha256, executable }) => {
                let bytes = store.get(sha256)?;
                if let Some(Node::Link { .. }) = cand.nodes.get(p) {
                    remove(&path)?;
                }
                write_atomic(&path, &bytes, *executable)?;
            }
            Some(Node::Link { target }) => {
                remove(&path)?;
                std::os::unix::fs::symlink(target, &path).with_context(|| format!("linking {}", path.display()))?;
            }
            None => remove(&path)?,
        }
    }
    Ok(())
}

/// Removes a file or a symlink itself (never its target); absent is fine.
fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// Writes `tree`'s entries for `paths` under `dir` (a scratch folder).
pub fn materialize(dir: &Path, store: &Store, tree: &Tree, paths: &[&str]) -> Result<()> {
    for p in paths {
        let path = check_inside(dir, p)?;
        remove(&path)?;
        match tree.nodes.get(*p) {
            Some(Node::File { sha256, executable }) => write_atomic(&path, &store.get(sha256)?, *executable)?,
            Some(Node::Link { target }) => {
                std::os::unix::fs::symlink(target, &path).with_context(|| format!("linking {}", path.display()))?
            }
            None => {}
        }
    }
    Ok(())
}

/// Runs git in `root` on literal paths; None where `root` is not a git work tree.
fn git_paths(root: &Path, args: &[&str], paths: &[&str]) -> Result<Option<BTreeSet<String>>> {
    let out = Cmd::new("git")
        .arg("--literal-pathspecs")
        .args(args.iter().copied())
        .args(["-z", "--"])
        .args(paths.iter().copied())
        .cwd(root)
        .quiet()
        .run()
        .context("running git")?;
    if !out.success() {
        return Ok(None);
    }
    Ok(Some(out.stdout.split('\0').filter(|p| !p.is_empty()).map(String::from).collect()))
}

/// Of `paths`, those whose git index entry holds the work tree's content and
/// differs from HEAD's: the attempt, staged.
pub fn staged(root: &Path, paths: &[&str]) -> Result<Vec<String>> {
    if paths.is_empty() {
        return Ok(Vec::new());
    }
    let (Some(unstaged), Some(cached)) = (
        git_paths(root, &["diff", "--no-ext-diff", "--name-only", "--no-renames"], paths)?,
        git_paths(root, &["diff", "--no-ext-diff", "--cached", "--name-only", "--no-renames"], paths)?,
    ) else {
        return Ok(Vec::new());
    };
    Ok(paths.iter().filter(|p| cached.contains(**p) && !unstaged.contains(**p)).map(|p| p.to_string()).collect())
}

/// Sets the index entries of `paths` back to HEAD's (removes them where HEAD has none).
pub fn unstage(root: &Path, paths: &[String]) -> Result<()> {
    if paths.is_empty() {
        return Ok(());
    }
    Cmd::new("git")
        .args(["--literal-pathspecs", "reset", "-q", "--"])
        .args(paths.iter().cloned())
        .cwd(root)
        .quiet()
        .run_checked()
        .context("unstaging the reverted attempt (git reset)")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: &Path, s: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    }

    #[test]
    fn diff_finds_modified_added_deleted() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::new(d.path().join("objects"));
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        write(&a.join("k/a.cu"), "a");
        write(&a.join("same.cuh"), "s");
        write(&a.join("gone.cu"), "g");
        write(&b.join("k/a.cu"), "a2");
        write(&b.join("same.cuh"), "s");
        write(&b.join("sub/new.cu"), "n");
        let (ta, tb) = (scan(&a, &store, &[]).unwrap(), scan(&b, &store, &[]).unwrap());
        assert_eq!(
            diff(&ta, &tb),
            vec![
                Change::Deleted("gone.cu".into()),
                Change::Modified("k/a.cu".into()),
                Change::Added("sub/new.cu".into())
            ]
        );
        assert_ne!(ta.hash(), tb.hash());
        assert_eq!(ta.hash(), scan(&a, &store, &[]).unwrap().hash());
    }

    #[test]
    fn a_path_behind_a_symlinked_folder_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let (root, outside) = (d.path().join("root"), d.path().join("outside"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("kernels")).unwrap();
        let err = check_inside(&root, "kernels/a.cu").unwrap_err().to_string();
        assert!(err.contains("is a symlink"), "{err}");
        assert!(check_inside(&root, "../x").is_err() && check_inside(&root, "/etc/x").is_err());
    }
}
