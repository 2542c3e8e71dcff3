//! Which Node is the session's: the one whose providerID names the
//! session's instance. A kubelet registers its own Node and sets its
//! providerID, so a compromised node could claim another instance's: the
//! choice never follows a claim that is not the only one, and once a node
//! is recorded for the session only that node counts.

/// Why no node was chosen though some claim the instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeChoice<'a> {
    /// The session's node.
    Chosen(&'a str),
    /// No Node claims the instance (yet).
    None,
    /// More than one Node claims it and none is recorded: trust none.
    Ambiguous(Vec<&'a str>),
    /// Nodes claim it, but not the one recorded for the session.
    NotTheRecorded,
}

/// `claims`: the names of the Nodes whose providerID names the instance;
/// `recorded`: the node already recorded for the session.
pub fn choose<'a>(claims: &[&'a str], recorded: Option<&str>) -> NodeChoice<'a> {
    match (claims, recorded) {
        ([], _) => NodeChoice::None,
        (_, Some(r)) => claims.iter().find(|c| **c == r).map_or(NodeChoice::NotTheRecorded, |c| NodeChoice::Chosen(c)),
        ([one], None) => NodeChoice::Chosen(one),
        (many, None) => NodeChoice::Ambiguous(many.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_claim_is_the_node_and_two_are_none() {
        assert_eq!(choose(&["ip-a"], None), NodeChoice::Chosen("ip-a"));
        assert_eq!(choose(&[], None), NodeChoice::None);
        assert_eq!(choose(&["ip-a", "impostor"], None), NodeChoice::Ambiguous(vec!["ip-a", "impostor"]));
    }

    #[test]
    fn a_recorded_node_is_never_replaced_by_a_later_claim() {
        assert_eq!(choose(&["impostor", "ip-a"], Some("ip-a")), NodeChoice::Chosen("ip-a"));
        assert_eq!(choose(&["impostor"], Some("ip-a")), NodeChoice::NotTheRecorded);
    }
}
