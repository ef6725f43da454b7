//! Field paths for locations: which field (`subsystems[0].namespaces[1].nsid`) a line and
//! column of the YAML text belong to.
//!
//! `serde-saphyr` reports where a syntax or type error is, not which field it is in. This
//! module replays the parser's events over the same text and records, for every node and
//! mapping key, where it starts and what its path is.

use serde_saphyr::granit_parser::{Event, Parser};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryKind {
    /// A mapping key; its path is the field it names.
    Key,
    /// A node (scalar, sequence, mapping, alias) in value position.
    Node,
}

#[derive(Debug)]
struct Entry {
    line: u64,
    column: u64,
    kind: EntryKind,
    path: String,
    /// Collections open around it: a key and its value are one deeper than their mapping.
    depth: usize,
    /// For mappings: where the mapping ends (once seen).
    mapping_end: Option<(u64, u64)>,
    /// For mappings: where the event that ends it starts (a flow mapping's `}`).
    closed_at: Option<(u64, u64)>,
}

enum Frame {
    Sequence {
        path: String,
        next: usize,
    },
    Mapping {
        path: String,
        /// `Some(path of the field)` after a key, while its value is pending.
        pending: Option<String>,
        /// Index of the mapping's entry.
        entry: usize,
    },
}

/// Where each node and key of a document starts, with its path.
#[derive(Debug, Default)]
pub(super) struct PathIndex {
    entries: Vec<Entry>,
}

/// Path of the root node.
pub(super) const ROOT: &str = "<root>";

fn join_key(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// The rest of line `line` of `text` from column `column` (both 1-based, columns in
/// characters); `None` past its end.
pub(super) fn rest_of_line(text: &str, line: u64, column: u64) -> Option<&str> {
    let l = text
        .lines()
        .nth(usize::try_from(line).ok()?.checked_sub(1)?)?;
    let skip = usize::try_from(column).ok()?.checked_sub(1)?;
    l.char_indices().nth(skip).map(|(i, _)| &l[i..])
}

fn display(path: &str) -> String {
    if path.is_empty() {
        ROOT.to_owned()
    } else {
        path.to_owned()
    }
}

impl PathIndex {
    /// Indexes `text` as far as it parses (a syntax error ends the index, which still
    /// covers everything before it).
    pub(super) fn build(text: &str) -> PathIndex {
        let mut entries: Vec<Entry> = Vec::new();
        let mut stack: Vec<Frame> = Vec::new();
        for item in Parser::new_from_str(text) {
            let Ok((event, span)) = item else { break };
            let line = span.start.line() as u64;
            let column = span.start.col() as u64 + 1;
            let (is_node, opens) = match &event {
                Event::Scalar(..) | Event::Alias(..) => (true, None),
                Event::SequenceStart(..) => (true, Some(true)),
                Event::MappingStart(..) => (true, Some(false)),
                Event::SequenceEnd | Event::MappingEnd => {
                    if let Some(Frame::Mapping { entry, .. }) = stack.pop() {
                        let end = (span.end.line() as u64, span.end.col() as u64 + 1);
                        entries[entry].mapping_end = Some(end);
                        let at = (span.start.line() as u64, span.start.col() as u64 + 1);
                        entries[entry].closed_at = Some(at);
                    }
                    continue;
                }
                _ => continue,
            };
            if !is_node {
                continue;
            }
            // Work out this node's path from its parent and record it.
            let (kind, path) = match stack.last_mut() {
                None => (EntryKind::Node, String::new()),
                Some(Frame::Sequence { path, next }) => {
                    let p = format!("{path}[{next}]");
                    *next += 1;
                    (EntryKind::Node, p)
                }
                Some(Frame::Mapping { path, pending, .. }) => match pending.take() {
                    Some(field) => (EntryKind::Node, field),
                    None => {
                        let key = match &event {
                            Event::Scalar(value, ..) => value.to_string(),
                            _ => "?".to_owned(),
                        };
                        let field = join_key(path, &key);
                        *pending = Some(field.clone());
                        (EntryKind::Key, field)
                    }
                },
            };
            entries.push(Entry {
                line,
                column,
                kind,
                path: path.clone(),
                depth: stack.len(),
                mapping_end: None,
                closed_at: None,
            });
            match opens {
                Some(true) => stack.push(Frame::Sequence { path, next: 0 }),
                Some(false) => stack.push(Frame::Mapping {
                    path,
                    pending: None,
                    entry: entries.len() - 1,
                }),
                None => {}
            }
        }
        PathIndex { entries }
    }

    /// Path of the node (not key) that starts at `line:column`, the outermost one if
    /// several do; otherwise of whatever starts last before it.
    pub(super) fn node_at(&self, line: u64, column: u64) -> String {
        self.find(line, column, EntryKind::Node)
    }

    /// Path of the field whose key starts at `line:column`; otherwise of whatever starts
    /// last before it.
    pub(super) fn key_at(&self, line: u64, column: u64) -> String {
        self.find(line, column, EntryKind::Key)
    }

    /// The innermost mapping around `line:column`: its path and where it starts.
    pub(super) fn mapping_around(&self, line: u64, column: u64) -> (String, u64, u64) {
        let pos = (line, column);
        self.entries
            .iter()
            .rev()
            .find(|e| {
                e.kind == EntryKind::Node
                    && (e.line, e.column) <= pos
                    && e.mapping_end.is_some_and(|end| pos <= end)
            })
            .map_or_else(
                || (ROOT.to_owned(), line, column),
                |e| (display(&e.path), e.line, e.column),
            )
    }

    /// Where the field whose key starts at `line:column` ends: at the next key of the
    /// same mapping, or where something outside the mapping starts (a flow mapping: its
    /// `}`); `None` for the end of the text. `None` overall when no key starts there.
    /// Blanking the text from the key to there leaves valid YAML without the field (in a
    /// flow mapping, a trailing comma at most).
    pub(super) fn field_end(
        &self,
        text: &str,
        line: u64,
        column: u64,
    ) -> Option<Option<(u64, u64)>> {
        let (i, m) = self.key_and_mapping(line, column)?;
        let depth = self.entries[i].depth;
        let next = self.entries[i + 1..]
            .iter()
            .find(|e| e.depth < depth || (e.depth == depth && e.kind == EntryKind::Key))
            .map(|e| (e.line, e.column));
        // A flow mapping ends with its `}` (its start may be an anchor or a tag).
        let closed = self.entries[m].closed_at?;
        if !rest_of_line(text, closed.0, closed.1).is_some_and(|r| r.starts_with('}')) {
            // Block style: what follows on a later line starts that line (a list item's
            // `- ` before the next item's first key must stay).
            return Some(next.map(|(l, c)| if l > line { (l, 1) } else { (l, c) }));
        }
        Some(Some(next.map_or(closed, |n| n.min(closed))))
    }

    /// Whether the mapping holding the key that starts at `line:column` has another key
    /// named `name`.
    pub(super) fn has_sibling(&self, line: u64, column: u64, name: &str) -> bool {
        let Some((i, m)) = self.key_and_mapping(line, column) else {
            return false;
        };
        let depth = self.entries[i].depth;
        let path = join_key(&self.entries[m].path, name);
        self.entries[m + 1..]
            .iter()
            .take_while(|e| e.depth >= depth)
            .any(|e| e.kind == EntryKind::Key && e.depth == depth && e.path == path)
    }

    /// The entries of the key that starts at `line:column` and of the mapping it is in.
    fn key_and_mapping(&self, line: u64, column: u64) -> Option<(usize, usize)> {
        let i = self
            .entries
            .iter()
            .position(|e| e.kind == EntryKind::Key && (e.line, e.column) == (line, column))?;
        let depth = self.entries[i].depth;
        let m = self.entries[..i].iter().rposition(|e| e.depth < depth)?;
        Some((i, m))
    }

    fn find(&self, line: u64, column: u64, kind: EntryKind) -> String {
        if let Some(entry) = self
            .entries
            .iter()
            .find(|e| e.line == line && e.column == column && e.kind == kind)
        {
            return display(&entry.path);
        }
        self.entries
            .iter()
            .rev()
            .find(|e| (e.line, e.column) <= (line, column))
            .map(|e| display(&e.path))
            .unwrap_or_else(|| ROOT.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::PathIndex;

    const DOC: &str = "\
io_threads: 2
listeners:
  - name: tcp0
    port: 4420
subsystems:
  - nqn: x
    namespaces:
      - nsid: 1
        backend: b
    hosts: [a, b]
";

    #[test]
    fn paths() {
        let index = PathIndex::build(DOC);
        assert_eq!(index.node_at(1, 13), "io_threads");
        assert_eq!(index.key_at(1, 1), "io_threads");
        assert_eq!(index.node_at(3, 5), "listeners[0]");
        assert_eq!(index.key_at(3, 5), "listeners[0].name");
        assert_eq!(index.node_at(4, 11), "listeners[0].port");
        assert_eq!(index.node_at(9, 18), "subsystems[0].namespaces[0].backend");
        assert_eq!(index.node_at(10, 16), "subsystems[0].hosts[1]");
        assert_eq!(index.node_at(1, 1), "<root>");
        assert_eq!(
            index.mapping_around(4, 5),
            ("listeners[0]".to_owned(), 3, 5)
        );
        assert_eq!(
            index.mapping_around(9, 9),
            ("subsystems[0].namespaces[0]".to_owned(), 8, 9)
        );
        assert_eq!(index.mapping_around(2, 1), ("<root>".to_owned(), 1, 1));
    }

    #[test]
    fn field_ends() {
        let index = PathIndex::build(DOC);
        // A scalar field: up to the line of the next key of its mapping.
        assert_eq!(index.field_end(DOC, 3, 5), Some(Some((4, 1))));
        // The last field of a list item: up to the next top-level key.
        assert_eq!(index.field_end(DOC, 4, 5), Some(Some((5, 1))));
        // A field whose value is a list of mappings: up to the line of the next key.
        assert_eq!(index.field_end(DOC, 7, 5), Some(Some((10, 1))));
        // The last field of an item followed by another: the next item's `- ` stays.
        let items = "a:\n  - x: 1\n    y: 2\n  - x: 3\n";
        assert_eq!(
            PathIndex::build(items).field_end(items, 3, 5),
            Some(Some((4, 1)))
        );
        // The last field of the document.
        assert_eq!(index.field_end(DOC, 10, 5), Some(None));
        // Not a key.
        assert_eq!(index.field_end(DOC, 1, 13), None);
        // In a flow mapping: up to the next key, or the closing brace.
        assert!(index.has_sibling(3, 5, "port"));
        assert!(!index.has_sibling(3, 5, "nsid"));
        assert!(index.has_sibling(1, 1, "subsystems"));
        let anchored = "a: &x {b: 1, c: 2}\nd: 3\n";
        assert_eq!(
            PathIndex::build(anchored).field_end(anchored, 1, 14),
            Some(Some((1, 18)))
        );
        let flow = "a: {b: {x: 1}, c: 2}\nd: 3\n";
        let index = PathIndex::build(flow);
        assert_eq!(index.field_end(flow, 1, 5), Some(Some((1, 16))));
        assert_eq!(index.field_end(flow, 1, 16), Some(Some((1, 20))));
    }
}
