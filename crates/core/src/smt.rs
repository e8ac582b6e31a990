//! A sparse Merkle tree over 256-bit paths: the state digest of a key-value snapshot that a single
//! untrusted server keeps and its clients check (A2M-Storage, A2M paper §4.2: "the snapshot, as a
//! Merkle tree"; a read carries "a proof that the read content is a valid part of the current
//! snapshot", and a writer computes the digest of the state after its write itself).
//!
//! The tree has a leaf position for every path (the hash of a key), all of them empty but the
//! stored ones. An empty subtree hashes to zero and a node of two empty children is empty, so only
//! paths to stored leaves cost anything: `node(l, r) = 0` if both are zero, else
//! `H("node", l ‖ r)`; a leaf is `H("leaf", path ‖ value)`, where `value` is the hash of the
//! stored content.
//!
//! A [`Proof`] is the 256 siblings of one path, zeros left out. It does not depend on the leaf's
//! own value, so the same proof gives the root with the leaf as it is, absent, or as a writer is
//! about to set it ([`Proof::root`]): a client that verified a read can compute the digest of the
//! snapshot after its own write without trusting the server for it.
//!
//! [`Tree`] is the server's side: a compressed binary trie (only nodes where both children are
//! non-empty are kept, each with its hash), so an update or a proof costs at most 256 hashes
//! whatever the number of keys.

use serde::{Deserialize, Serialize};

/// A node's, a leaf's or a root's hash.
pub type Hash = [u8; 32];

/// A position: 256 bits, the first bit the root's choice (0 left, 1 right).
pub type Path = [u8; 32];

/// The hash of an empty subtree, and the root of an empty tree.
pub const EMPTY: Hash = [0; 32];

const DEPTH: usize = 256;

fn bit(path: &Path, level: usize) -> bool {
    path[level / 8] & (0x80 >> (level % 8)) != 0
}

fn leaf_hash(path: &Path, value: &Hash) -> Hash {
    let mut hasher = blake3::Hasher::new_derive_key("bulwark smt leaf v1");
    hasher.update(path);
    hasher.update(value);
    *hasher.finalize().as_bytes()
}

fn node_hash(left: &Hash, right: &Hash) -> Hash {
    if *left == EMPTY && *right == EMPTY {
        return EMPTY;
    }
    let mut hasher = blake3::Hasher::new_derive_key("bulwark smt node v1");
    hasher.update(left);
    hasher.update(right);
    *hasher.finalize().as_bytes()
}

/// `hash`, the node at depth `from` on `path`, raised to depth `to ≤ from` through empty siblings.
fn raise(mut hash: Hash, path: &Path, from: usize, to: usize) -> Hash {
    for level in (to..from).rev() {
        hash = if bit(path, level) {
            node_hash(&EMPTY, &hash)
        } else {
            node_hash(&hash, &EMPTY)
        };
    }
    hash
}

/// The siblings of one path, from the root's children down to the leaf's: a bitmap of which
/// are non-empty, and those, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    present: [u8; 32],
    siblings: Vec<Hash>,
}

/// Why a proof was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// The bitmap names more or fewer siblings than the proof carries.
    #[error("the proof's bitmap names {named} siblings but it carries {carried}")]
    Malformed {
        /// Siblings the bitmap names.
        named: usize,
        /// Siblings carried.
        carried: usize,
    },
    /// A sibling said to be present is the empty hash.
    #[error("the proof carries an empty sibling as present")]
    EmptySibling,
}

impl Proof {
    /// The root of the tree these siblings come from, with the leaf at `path` holding `value`
    /// (`None`: no leaf there). A proof that is not well formed roots nothing.
    pub fn root(&self, path: &Path, value: Option<&Hash>) -> Result<Hash, ProofError> {
        let named = self.present.iter().map(|b| b.count_ones() as usize).sum();
        if named != self.siblings.len() {
            return Err(ProofError::Malformed {
                named,
                carried: self.siblings.len(),
            });
        }
        if self.siblings.contains(&EMPTY) {
            return Err(ProofError::EmptySibling);
        }
        let mut hash = value.map_or(EMPTY, |value| leaf_hash(path, value));
        let mut siblings = self.siblings.iter().rev();
        for level in (0..DEPTH).rev() {
            let sibling = if bit(&self.present, level) {
                siblings.next().copied().unwrap_or(EMPTY)
            } else {
                EMPTY
            };
            hash = if bit(path, level) {
                node_hash(&sibling, &hash)
            } else {
                node_hash(&hash, &sibling)
            };
        }
        Ok(hash)
    }

    /// Whether the proof shows `path` holding `value` (or nothing) in the tree with `root`.
    pub fn proves(&self, root: &Hash, path: &Path, value: Option<&Hash>) -> bool {
        self.root(path, value)
            .is_ok_and(|computed| computed == *root)
    }

    /// Non-empty siblings carried.
    pub fn len(&self) -> usize {
        self.siblings.len()
    }

    /// Whether the path's siblings are all empty (the tree holds at most this leaf).
    pub fn is_empty(&self) -> bool {
        self.siblings.is_empty()
    }
}

/// The server's tree: a compressed trie over the stored paths.
#[derive(Clone, Debug, Default)]
pub struct Tree {
    root: Option<Box<Node>>,
    len: usize,
}

#[derive(Clone, Debug)]
enum Node {
    /// A stored leaf at depth 256.
    Leaf { path: Path, value: Hash, hash: Hash },
    /// Both sides non-empty below bit `depth`; `hash` is the node's at that depth.
    Branch {
        depth: usize,
        /// Any path under the node: its bits above `depth` are the node's position.
        path: Path,
        left: Box<Node>,
        right: Box<Node>,
        hash: Hash,
    },
}

impl Node {
    fn leaf(path: Path, value: Hash) -> Node {
        Node::Leaf {
            path,
            value,
            hash: leaf_hash(&path, &value),
        }
    }

    fn depth(&self) -> usize {
        match self {
            Node::Leaf { .. } => DEPTH,
            Node::Branch { depth, .. } => *depth,
        }
    }

    fn path(&self) -> &Path {
        match self {
            Node::Leaf { path, .. } | Node::Branch { path, .. } => path,
        }
    }

    fn own_hash(&self) -> Hash {
        match self {
            Node::Leaf { hash, .. } | Node::Branch { hash, .. } => *hash,
        }
    }

    /// The node's hash seen from depth `at` above it.
    fn hash_at(&self, at: usize) -> Hash {
        raise(self.own_hash(), self.path(), self.depth(), at)
    }

    fn branch(depth: usize, a: Node, b: Node) -> Node {
        let (left, right) = if bit(a.path(), depth) { (b, a) } else { (a, b) };
        let hash = node_hash(&left.hash_at(depth + 1), &right.hash_at(depth + 1));
        Node::Branch {
            depth,
            path: *left.path(),
            left: Box::new(left),
            right: Box::new(right),
            hash,
        }
    }
}

/// The first level at which `a` and `b` differ, or 256 if they are equal.
fn divergence(a: &Path, b: &Path) -> usize {
    (0..DEPTH)
        .find(|&level| bit(a, level) != bit(b, level))
        .unwrap_or(DEPTH)
}

impl Tree {
    /// An empty tree.
    pub fn new() -> Tree {
        Tree::default()
    }

    /// The root hash.
    pub fn root(&self) -> Hash {
        self.root.as_ref().map_or(EMPTY, |node| node.hash_at(0))
    }

    /// Leaves stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no leaf is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value stored at `path`.
    pub fn get(&self, path: &Path) -> Option<Hash> {
        let mut node = self.root.as_deref()?;
        loop {
            match node {
                Node::Leaf {
                    path: at, value, ..
                } => return (at == path).then_some(*value),
                Node::Branch {
                    depth, left, right, ..
                } => {
                    if divergence(node.path(), path) < *depth {
                        return None;
                    }
                    node = if bit(path, *depth) { right } else { left };
                }
            }
        }
    }

    /// Stores `value` at `path` (`None` removes the leaf there, if any).
    pub fn set(&mut self, path: Path, value: Option<Hash>) {
        let root = self.root.take().map(|node| *node);
        let (root, delta) = match value {
            Some(value) => {
                let (node, added) = insert(root, path, value);
                (Some(node), isize::from(added))
            }
            None => {
                let (node, removed) = remove(root, &path);
                (node, -isize::from(removed))
            }
        };
        self.root = root.map(Box::new);
        self.len = self.len.saturating_add_signed(delta);
    }

    /// The siblings of `path`, whether or not a leaf is stored there.
    pub fn prove(&self, path: &Path) -> Proof {
        let mut siblings = vec![EMPTY; DEPTH];
        let mut node = self.root.as_deref();
        while let Some(current) = node {
            match current {
                Node::Leaf { path: at, hash, .. } => {
                    if at != path {
                        // Another leaf where ours would be: it is the sibling where they part.
                        let level = divergence(at, path);
                        siblings[level] = raise(*hash, at, DEPTH, level + 1);
                    }
                    node = None;
                }
                Node::Branch {
                    depth, left, right, ..
                } => {
                    let level = divergence(current.path(), path);
                    if level < *depth {
                        // Ours leaves this subtree above its branch: the subtree is the sibling.
                        siblings[level] = current.hash_at(level + 1);
                        node = None;
                    } else {
                        let (ours, other) = if bit(path, *depth) {
                            (right, left)
                        } else {
                            (left, right)
                        };
                        siblings[*depth] = other.hash_at(depth + 1);
                        node = Some(ours);
                    }
                }
            }
        }
        let mut present = [0u8; 32];
        let mut carried = Vec::new();
        for (level, sibling) in siblings.into_iter().enumerate() {
            if sibling != EMPTY {
                present[level / 8] |= 0x80 >> (level % 8);
                carried.push(sibling);
            }
        }
        Proof {
            present,
            siblings: carried,
        }
    }
}

/// `node` with `value` at `path`; whether a leaf was added (rather than replaced).
fn insert(node: Option<Node>, path: Path, value: Hash) -> (Node, bool) {
    let Some(node) = node else {
        return (Node::leaf(path, value), true);
    };
    let level = divergence(node.path(), &path);
    if level < node.depth() {
        // The new leaf parts from this subtree above it: a branch where they part.
        return (Node::branch(level, node, Node::leaf(path, value)), true);
    }
    match node {
        Node::Leaf { .. } => (Node::leaf(path, value), false),
        Node::Branch {
            depth, left, right, ..
        } => {
            let (left, right, added) = if bit(&path, depth) {
                let (right, added) = insert(Some(*right), path, value);
                (*left, right, added)
            } else {
                let (left, added) = insert(Some(*left), path, value);
                (left, *right, added)
            };
            (Node::branch(depth, left, right), added)
        }
    }
}

/// `node` without a leaf at `path`; whether one was there.
fn remove(node: Option<Node>, path: &Path) -> (Option<Node>, bool) {
    let Some(node) = node else {
        return (None, false);
    };
    if divergence(node.path(), path) < node.depth() {
        return (Some(node), false);
    }
    match node {
        Node::Leaf { .. } => (None, true),
        Node::Branch {
            depth, left, right, ..
        } => {
            let (ours, other, ours_is_right) = if bit(path, depth) {
                (*right, *left, true)
            } else {
                (*left, *right, false)
            };
            let (ours, removed) = remove(Some(ours), path);
            let node = match ours {
                // One side left: the branch is gone, the other side moves up as it is.
                None => other,
                Some(ours) if ours_is_right => Node::branch(depth, other, ours),
                Some(ours) => Node::branch(depth, ours, other),
            };
            (Some(node), removed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The tree's definition, computed the slow way: every level of every stored path.
    fn reference_root(leaves: &BTreeMap<Path, Hash>) -> Hash {
        fn subtree(leaves: &[(&Path, &Hash)], level: usize) -> Hash {
            if leaves.is_empty() {
                return EMPTY;
            }
            if level == DEPTH {
                return leaf_hash(leaves[0].0, leaves[0].1);
            }
            let split = leaves.partition_point(|(path, _)| !bit(path, level));
            node_hash(
                &subtree(&leaves[..split], level + 1),
                &subtree(&leaves[split..], level + 1),
            )
        }
        let sorted: Vec<_> = leaves.iter().collect();
        subtree(&sorted, 0)
    }

    /// Paths that share long prefixes, so that branches sit deep and shallow.
    fn path() -> impl Strategy<Value = Path> {
        (any::<u8>(), 0..3usize).prop_map(|(byte, shape)| {
            let mut path = [0u8; 32];
            match shape {
                0 => path[0] = byte,
                1 => path[31] = byte,
                _ => path = [byte; 32],
            }
            path
        })
    }

    proptest! {
        /// After any sets and removals, the root is the definition's, every stored path proves
        /// its value, every other path proves absence, and a proof roots the tree after a write
        /// to its own path: what a client computes is what the server gets.
        #[test]
        fn the_tree_is_its_definition_and_its_proofs_hold(
            ops in proptest::collection::vec((path(), proptest::option::of(any::<u8>())), 1..60),
            probes in proptest::collection::vec(path(), 1..8),
        ) {
            let mut tree = Tree::new();
            let mut model = BTreeMap::new();
            for (path, value) in &ops {
                let value = value.map(|v| [v; 32]);
                let proof = tree.prove(path);
                let before = tree.root();
                prop_assert!(proof.proves(&before, path, model.get(path)));
                tree.set(*path, value);
                match value {
                    Some(value) => model.insert(*path, value),
                    None => model.remove(path),
                };
                prop_assert_eq!(tree.root(), reference_root(&model));
                prop_assert_eq!(proof.root(path, value.as_ref()), Ok(tree.root()));
                prop_assert_eq!(tree.len(), model.len());
            }
            for path in model.keys().chain(&probes) {
                let proof = tree.prove(path);
                prop_assert!(proof.proves(&tree.root(), path, model.get(path)));
                prop_assert_eq!(tree.get(path), model.get(path).copied());
                // No other value, and no absence of a present one, is proved.
                let other = [0xee; 32];
                prop_assert!(!proof.proves(&tree.root(), path, Some(&other)) || model.get(path) == Some(&other));
                if model.contains_key(path) {
                    prop_assert!(!proof.proves(&tree.root(), path, None));
                }
            }
        }
    }

    #[test]
    fn an_empty_tree_roots_at_zero_and_malformed_proofs_root_nothing() {
        let tree = Tree::new();
        assert_eq!(tree.root(), EMPTY);
        let proof = tree.prove(&[1; 32]);
        assert!(proof.is_empty() && proof.proves(&EMPTY, &[1; 32], None));
        let mut tree = Tree::new();
        tree.set([1; 32], Some([2; 32]));
        tree.set([0; 32], Some([3; 32]));
        let mut proof = tree.prove(&[1; 32]);
        assert_eq!(proof.len(), 1);
        proof.siblings.push([9; 32]);
        assert!(matches!(
            proof.root(&[1; 32], None),
            Err(ProofError::Malformed { .. })
        ));
        let mut proof = tree.prove(&[1; 32]);
        proof.siblings[0] = EMPTY;
        assert_eq!(proof.root(&[1; 32], None), Err(ProofError::EmptySibling));
    }
}
