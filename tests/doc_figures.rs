//! Figures one page quotes from another page's measured table must be that
//! table's (issue 31: docs/migrating.md quoted the peers' fairness from an
//! older run than docs/redlock.md's). Needs no server.

use std::path::Path;

fn page(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The figures with two decimals (`1.01`, `2.83`: how the tables write
/// fairness) in `text`; versions (`4.2`, `5.0`) are not among them.
fn figures(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map(|w| w.trim_matches('.'))
        .filter(|w| matches!(w.split_once('.'), Some((i, d)) if !i.is_empty() && d.len() == 2 && !d.contains('.')))
        .map(str::to_string)
        .collect()
}

/// The fairness column of redlock.md's side-by-side table, by row label.
fn redlock_fairness() -> Vec<(String, String)> {
    let doc = page("docs/redlock.md");
    let header = doc
        .lines()
        .position(|l| l.starts_with("| client | grants/s") && l.contains("fairness"))
        .expect("redlock.md's side-by-side table");
    let columns: Vec<&str> = doc.lines().nth(header).unwrap().split('|').collect();
    let at = columns.iter().position(|c| c.trim() == "fairness").unwrap();
    doc.lines()
        .skip(header + 2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').collect();
            (cells[1].trim().to_string(), cells[at].trim().to_string())
        })
        .collect()
}

#[test]
fn the_fairness_migrating_md_quotes_is_redlock_md_s() {
    let table = redlock_fairness();
    assert!(table.len() >= 4, "{table:?}");
    let doc = page("docs/migrating.md");
    let bullet = doc
        .split("\n- ")
        .find(|b| b.starts_with("**Fair waiting**"))
        .expect("migrating.md's Fair waiting bullet");
    let quoted = figures(bullet);
    assert!(quoted.len() >= 4, "{bullet}");
    for f in &quoted {
        assert!(
            table.iter().any(|(_, v)| v == f),
            "migrating.md quotes fairness {f}, which redlock.md's table does not have: {table:?}"
        );
    }
    let this = &table[0];
    assert!(this.0.starts_with("this client"), "{table:?}");
    assert_eq!(quoted[0], this.1, "this client's fairness first");
}
