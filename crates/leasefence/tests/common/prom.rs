//! A strict parser of the Prometheus text exposition format (version 0.0.4),
//! hand-written so the tests need no parser crate: every line is a comment
//! (`# HELP`, `# TYPE`, or free text) or a sample `name{label="value",…}
//! value [timestamp]`; names, label names, escapes and numbers are checked,
//! a `# TYPE` comes before its samples and at most once, and a histogram's
//! buckets are cumulative and end in `+Inf` equal to its `_count`.

use std::collections::BTreeMap;

/// Series (name with its labels, as written) → value; and name → type.
#[derive(Debug, Default)]
pub struct Exposition {
    pub samples: BTreeMap<String, f64>,
    pub types: BTreeMap<String, String>,
}

impl Exposition {
    pub fn get(&self, series: &str) -> Option<f64> {
        self.samples.get(series).copied()
    }

    /// The sum of every series of `name` (all label sets).
    pub fn total(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|(s, _)| s.as_str() == name || s.starts_with(&format!("{name}{{")))
            .map(|(_, v)| v)
            .sum()
    }
}

fn name_ok(s: &str, colons: bool) -> bool {
    let mut chars = s.chars();
    let first = chars.next();
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':');
    first.is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':')) && chars.all(ok)
}

fn number(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|_| format!("bad number {s:?}")),
    }
}

type Labels = Vec<(String, String)>;

/// Parses `{a="x",b="y"}`; returns the labels and the rest of the line.
fn labels(s: &str) -> Result<(Labels, &str), String> {
    let mut out = Vec::new();
    let mut rest = s.strip_prefix('{').ok_or("expected {")?;
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((out, r));
        }
        let (name, r) = rest.split_once("=\"").ok_or_else(|| format!("bad label in {s:?}"))?;
        if !name_ok(name, false) {
            return Err(format!("bad label name {name:?}"));
        }
        let mut value = String::new();
        let mut chars = r.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err(format!("unterminated label value in {s:?}")),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("bad escape {other:?} in {s:?}")),
                },
                Some((_, c)) => value.push(c),
            }
        };
        out.push((name.to_string(), value));
        rest = &r[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut e = Exposition::default();
    let mut sampled: Vec<String> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let at = |m: String| format!("line {}: {m}: {line:?}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.split_whitespace().collect();
            if words.first() == Some(&"TYPE") {
                let [_, name, kind] = words[..] else {
                    return Err(at("TYPE takes a name and a type".into()));
                };
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                    return Err(at(format!("unknown type {kind}")));
                }
                if e.types.insert(name.to_string(), kind.to_string()).is_some() || sampled.iter().any(|s| s == name) {
                    return Err(at(format!("TYPE of {name} repeated or after its samples")));
                }
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| at("no value".into()))?;
        let name = &line[..name_end];
        if !name_ok(name, true) {
            return Err(at(format!("bad metric name {name:?}")));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            labels(&line[name_end..]).map_err(at)?
        } else {
            (Vec::new(), &line[name_end..])
        };
        let mut fields = rest.split_whitespace();
        let value = number(fields.next().ok_or_else(|| at("no value".into()))?).map_err(at)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>().map_err(|_| at(format!("bad timestamp {ts:?}")))?;
        }
        if fields.next().is_some() {
            return Err(at("trailing fields".into()));
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|b| e.types.get(*b).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        sampled.push(family.to_string());
        let rendered: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        let series = if rendered.is_empty() {
            name.to_string()
        } else {
            format!("{name}{{{}}}", rendered.join(","))
        };
        if e.samples.insert(series.clone(), value).is_some() {
            return Err(at(format!("series {series} repeated")));
        }
    }
    check_histograms(&e)?;
    Ok(e)
}

/// Per histogram series: buckets non-decreasing in `le`, the last is `+Inf`
/// and equals `_count`.
fn check_histograms(e: &Exposition) -> Result<(), String> {
    for (name, _) in e.types.iter().filter(|(_, t)| t.as_str() == "histogram") {
        let mut by_labels: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        let prefix = format!("{name}_bucket{{");
        for (series, v) in e
            .samples
            .range(prefix.clone()..)
            .take_while(|(s, _)| s.starts_with(&prefix))
        {
            let inner = &series[prefix.len()..series.len() - 1];
            let (le, others): (Vec<&str>, Vec<&str>) = inner.split(',').partition(|l| l.starts_with("le="));
            let le = le.first().ok_or_else(|| format!("{series}: no le"))?;
            let le = number(le.trim_start_matches("le=").trim_matches('"'))?;
            by_labels.entry(others.join(",")).or_default().push((le, *v));
        }
        for (labels, mut buckets) in by_labels {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
                return Err(format!("{name}{{{labels}}}: buckets not cumulative: {buckets:?}"));
            }
            let count_series = if labels.is_empty() {
                format!("{name}_count")
            } else {
                format!("{name}_count{{{labels}}}")
            };
            let last = buckets.last().copied().unwrap_or((0.0, 0.0));
            if last.0 != f64::INFINITY || e.get(&count_series) != Some(last.1) {
                return Err(format!(
                    "{name}{{{labels}}}: +Inf bucket {last:?} vs {count_series} {:?}",
                    e.get(&count_series)
                ));
            }
        }
    }
    Ok(())
}
