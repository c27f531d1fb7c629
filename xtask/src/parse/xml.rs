//! Tool XML into serde types. Pure. quick-xml's deserializer ignores the root
//! element's name and reads an empty element as a complete, empty report, so the
//! root is checked first: output of another tool, or none at all, is an error
//! rather than a report with nothing in it. A document must end with its root's
//! end tag, so output cut short is an error too.

use anyhow::{Context, Result, bail};
use quick_xml::events::Event;
use serde::de::DeserializeOwned;

/// Deserializes `xml`, whose root element must be `root`; `what` names the
/// output in errors ("compute-sanitizer XML").
pub fn from_str<T: DeserializeOwned>(xml: &str, root: &str, what: &str) -> Result<T> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let (found, empty) = loop {
        match reader.read_event().with_context(|| format!("{what} is not XML"))? {
            Event::Start(e) => break (e.name().as_ref().to_string(), false),
            Event::Empty(e) => break (e.name().as_ref().to_string(), true),
            Event::Eof => bail!("{what} has no <{root}> element: empty, or not XML"),
            _ => {}
        }
    };
    if found != root {
        bail!("{what} has root <{found}>, expected <{root}>");
    }
    // quick-xml takes a document whose last end tag is cut (`</root` at the end)
    // as complete: the document must end with the root's end.
    let end = xml.trim_end();
    if !(end.ends_with(&format!("</{root}>")) || (empty && end.ends_with("/>"))) {
        bail!("{what} is cut short: it does not end with </{root}>");
    }
    quick_xml::de::from_str(xml).with_context(|| format!("{what} does not parse (cut short?)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Doc {
        #[serde(rename = "item", default)]
        items: Vec<String>,
    }

    fn items(xml: &str) -> Result<usize> {
        from_str::<Doc>(xml, "doc", "test XML").map(|d| d.items.len())
    }

    #[test]
    fn root_must_be_the_expected_element() {
        assert_eq!(items("<?xml version=\"1.0\"?>\n<!-- c --><doc><item>a</item></doc>").unwrap(), 1);
        assert_eq!(items("<doc/>").unwrap(), 0);
        for (xml, says) in [
            ("", "no <doc>"),
            ("  \n", "no <doc>"),
            ("<?xml version=\"1.0\"?>", "no <doc>"),
            ("<other/>", "root <other>"),
            ("<other><item>a</item></other>", "root <other>"),
            ("<doc><item>a</item>", "cut short"),
            ("<doc><item>a</item></doc", "cut short"),
            ("<doc><item>a</item></do", "cut short"),
        ] {
            let err = format!("{:#}", items(xml).unwrap_err());
            assert!(err.contains(says), "{xml:?}: {err}");
        }
    }

    #[test]
    fn doctype_inside_text_is_not_a_panic() {
        // quick-xml 0.38 reached `unreachable!` on this; whatever it reads now, it returns.
        let read = std::panic::catch_unwind(|| items("<doc><item>a<!DOCTYPE x>b</item></doc>").is_ok());
        assert!(read.is_ok(), "quick-xml panicked on a DOCTYPE inside text");
    }
}
