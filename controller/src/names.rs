//! The names CAPT passes to Terraform, and whose each one is. Pure: no API server.
//!
//! Every namespace's Workspaces run on the platform's provider, most often under one
//! ProviderConfig (one cloud account), so a name that reaches Terraform names something in
//! that account: an EKS cluster, a VPC, the tags that find them. CAPT's name keys
//! ([`NAME_KEYS`]: `CLUSTER_NAME`, `VPC_NAME`) therefore carry the namespace:
//! `<namespace>_<name>` ([`namespaced`]). A Kubernetes namespace's name never holds `_` (it is
//! a DNS label), so the mapping is injective: two namespaces' Clusters named `prod` render
//! `team-a_prod` and `team-b_prod`, and the text before a name's first `_` says whose it is.
//!
//! - An apply that exists keeps the name it recorded ([`kept_or_namespaced`]): a Cluster's
//!   bare name, rendered before this rule, stays (a new name would replace the EKS cluster),
//!   and so does the bare name of a Cluster's second apply, created later, when its first
//!   one records it (the VPC and the EKS cluster of one Cluster carry one name).
//! - A name EKS would refuse (over [`MAX_EKS_NAME`] characters, or a `.`, which a Cluster's
//!   name may hold) is not rendered ([`eks_name_problem`]): the CAPT objects say why.
//! - An apply written by hand may not set a name key to another namespace's name: a value
//!   `<other>_…`, or a bare value that an older apply of another namespace holds, when the
//!   two namespaces may use one ProviderConfig ([`refusal`]).

use jiff::Timestamp;
use std::collections::BTreeMap;

/// The key of the Cluster's name (the EKS cluster's, as the samples use it).
pub const CLUSTER_NAME: &str = "CLUSTER_NAME";
/// The key of the VPC's name (`spec.vpcConfig.name` of a CAPTCluster).
pub const VPC_NAME: &str = "VPC_NAME";
/// The keys whose values are names, and so carry their namespace.
pub const NAME_KEYS: [&str; 2] = [CLUSTER_NAME, VPC_NAME];
/// Between the namespace and the name: a character no namespace's name holds.
pub const SEPARATOR: char = '_';
/// The longest name EKS takes for a cluster.
pub const MAX_EKS_NAME: usize = 100;
/// Condition type on a CAPTCluster or a CAPTControlPlane: False when the name its Cluster
/// would get in Terraform is one EKS refuses.
pub const CLUSTER_NAME_VALID_CONDITION: &str = "ClusterNameValid";
/// Reason of `ClusterNameValid=False`.
pub const CLUSTER_NAME_INVALID: &str = "ClusterNameInvalid";
/// Condition reason (and Warning Event reason) of an apply whose name key holds another
/// namespace's name.
pub const PLATFORM_NAME_OF_ANOTHER: &str = "PlatformNameOfAnother";

/// `<namespace>_<name>`.
pub fn namespaced(namespace: &str, name: &str) -> String {
    format!("{namespace}{SEPARATOR}{name}")
}

/// The value to pass for `name` (a Cluster's, a VPC's) of `namespace`: the bare `name` when
/// the object's own apply recorded it (`own`: that apply's value, `None` when there is no
/// apply yet), or, with no apply yet, when an apply of the same Cluster did (`siblings`);
/// otherwise [`namespaced`]. So an apply rendered before names carried their namespace keeps
/// its name, and the other apply of its Cluster takes the same.
pub fn kept_or_namespaced(
    namespace: &str,
    name: &str,
    own: Option<&str>,
    siblings: &[String],
) -> String {
    let kept = match own {
        Some(recorded) => recorded == name,
        None => siblings.iter().any(|s| s == name),
    };
    match kept {
        true => name.to_owned(),
        false => namespaced(namespace, name),
    }
}

/// The `CLUSTER_NAME` of the Cluster `namespace`/`cluster` ([`kept_or_namespaced`]), or,
/// when that is a new name EKS would refuse ([`eks_name_problem`]), the message of
/// `ClusterNameValid=False`. A bare name kept is not judged: it runs already.
pub fn cluster_name(
    namespace: &str,
    cluster: &str,
    own: Option<&str>,
    siblings: &[String],
) -> Result<String, String> {
    let name = kept_or_namespaced(namespace, cluster, own, siblings);
    match eks_name_problem(&name).filter(|_| name != cluster) {
        None => Ok(name),
        Some(problem) => Err(format!(
            "the EKS cluster name of Cluster {namespace}/{cluster} would be \"{name}\" (CAPT \
             gives a Cluster's name its namespace, <namespace>{SEPARATOR}<name>, so that no two \
             namespaces' names meet), {problem}: create the Cluster again under a shorter \
             name, or in a namespace of a shorter name; nothing is rendered"
        )),
    }
}

/// Why EKS would refuse `name` as a cluster's name, if it would: over [`MAX_EKS_NAME`]
/// characters, or a character other than letters, digits, `-` and `_` (a Cluster's name may
/// hold `.`), or not starting with a letter or digit.
pub fn eks_name_problem(name: &str) -> Option<String> {
    let length = name.chars().count();
    if length > MAX_EKS_NAME {
        return Some(format!(
            "{length} characters long, over EKS's limit of {MAX_EKS_NAME}"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_')))
    {
        return Some(format!(
            "holding {c:?}, which EKS refuses (letters, digits, '-' and '_' only)"
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Some("not starting with a letter or a digit, as EKS requires".into());
    }
    None
}

/// The namespace whose name `value` is, when it holds [`SEPARATOR`]: the text before it.
pub fn namespace_of(value: &str) -> Option<&str> {
    value.split_once(SEPARATOR).map(|(namespace, _)| namespace)
}

/// An apply as [`refusal`] sees it.
#[derive(Clone, Copy, Debug)]
pub struct Holder<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// When it was created (`None`: not stored yet, the youngest).
    pub created: Option<Timestamp>,
    /// Its `spec.variables`.
    pub variables: Option<&'a BTreeMap<String, String>>,
}

impl Holder<'_> {
    /// True when one of its name keys has `value`.
    fn holds(&self, value: &str) -> bool {
        let variables = self.variables.into_iter().flatten();
        variables
            .filter(|(k, _)| NAME_KEYS.contains(&k.as_str()))
            .any(|(_, v)| v == value)
    }

    /// The order of age: the older first, ties broken by namespace and name.
    fn age(&self) -> (Timestamp, &str, &str) {
        (
            self.created.unwrap_or(Timestamp::MAX),
            self.namespace,
            self.name,
        )
    }
}

/// True when one of the name keys of `own` has a bare value (no namespace): only then does
/// [`refusal`] read the other applies.
pub fn holds_a_bare_name(own: &Holder<'_>) -> bool {
    let variables = own.variables.into_iter().flatten();
    variables
        .filter(|(k, _)| NAME_KEYS.contains(&k.as_str()))
        .any(|(_, v)| namespace_of(v).is_none())
}

/// Why the apply `own` must not be rendered with the values of its name keys, if it must not:
/// a value `<other>_…` names namespace `other`'s object; a bare value is another namespace's
/// when the oldest apply holding it (`others`, every apply the controller sees, its own
/// included or not) is of a namespace that may use one ProviderConfig with `own`'s
/// (`shares_provider_config`). `others` is read only for a bare value. No value is shown (the
/// messages go into Events): the key, and the namespace a prefix names.
pub fn refusal<'a>(
    own: &Holder<'_>,
    others: impl IntoIterator<Item = Holder<'a>>,
    shares_provider_config: impl Fn(&str) -> bool,
) -> Option<String> {
    let ns = own.namespace;
    let mut bare = Vec::new();
    for key in NAME_KEYS {
        let Some(value) = own.variables.and_then(|v| v.get(key)) else {
            continue;
        };
        match namespace_of(value) {
            Some(prefix) if prefix != ns => {
                return Some(format!(
                    "spec.variables.{key} starts with \"{prefix}{SEPARATOR}\": that is a name of \
                     namespace {prefix} (CAPT's names carry their namespace, \
                     <namespace>{SEPARATOR}<name>); this namespace's start with \
                     \"{ns}{SEPARATOR}\"; nothing is rendered"
                ));
            }
            Some(_) => {}
            None => bare.push((key, value.as_str())),
        }
    }
    if bare.is_empty() {
        return None;
    }
    let mut oldest: Vec<Option<Holder<'a>>> = vec![None; bare.len()];
    for other in others {
        for ((_, value), oldest) in bare.iter().zip(oldest.iter_mut()) {
            let older = oldest.as_ref().is_none_or(|o| other.age() < o.age());
            if older && other.holds(value) {
                *oldest = Some(other);
            }
        }
    }
    bare.iter().zip(oldest).find_map(|((key, _), holder)| {
        let holder = holder?;
        let of_another = holder.namespace != ns
            && holder.age() < own.age()
            && shares_provider_config(holder.namespace);
        of_another.then(|| {
            format!(
                "spec.variables.{key} is a name an older apply of another namespace holds, under \
                 a ProviderConfig this namespace may use too; this namespace's names start with \
                 \"{ns}{SEPARATOR}\"; nothing is rendered"
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn at(seconds: i64) -> Option<Timestamp> {
        Some(Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn two_namespaces_clusters_of_one_name_get_two_names_and_the_prefix_says_whose() {
        let (a, b) = (namespaced("team-a", "prod"), namespaced("team-b", "prod"));
        assert_ne!(a, b);
        assert_eq!(a, "team-a_prod");
        assert_eq!(namespace_of(&a), Some("team-a"));
        assert_eq!(namespace_of("prod"), None);
        // A name holding `_` still says its namespace: the first `_` ends it.
        assert_eq!(namespace_of(&namespaced("team", "my_vpc")), Some("team"));
        // `team-a`/`b_c` and `team-a_b`/`c` cannot both exist: no namespace holds `_`.
        assert_eq!(namespaced("team-a", "b_c"), "team-a_b_c");
    }

    #[test]
    fn an_apply_keeps_the_bare_name_it_recorded_and_its_cluster_keeps_one_name() {
        let new = |own, siblings: &[String]| kept_or_namespaced("ns", "demo", own, siblings);
        // New: namespaced.
        assert_eq!(new(None, &[]), "ns_demo");
        // Recorded before the rule: kept.
        assert_eq!(new(Some("demo"), &[]), "demo");
        // Recorded since: kept too.
        assert_eq!(new(Some("ns_demo"), &["demo".into()]), "ns_demo");
        // Anything else (a hand edit our apply puts back): namespaced.
        assert_eq!(new(Some("other"), &[]), "ns_demo");
        // No apply yet, the Cluster's other apply recorded the bare name: the same name.
        assert_eq!(new(None, &["demo".into()]), "demo");
        assert_eq!(new(None, &["ns_demo".into()]), "ns_demo");
    }

    #[test]
    fn a_cluster_whose_new_name_eks_refuses_gets_no_name_and_says_why() {
        assert_eq!(
            cluster_name("team", "prod", None, &[]).as_deref(),
            Ok("team_prod")
        );
        let dotted = cluster_name("team", "prod.eu", None, &[]).unwrap_err();
        assert!(
            dotted.contains("team/prod.eu") && dotted.contains("\"team_prod.eu\""),
            "{dotted}"
        );
        let long = "c".repeat(MAX_EKS_NAME - "team_".len() + 1);
        let message = cluster_name("team", &long, None, &[]).unwrap_err();
        assert!(message.contains("101 characters"), "{message}");
        assert!(cluster_name("team", &long[1..], None, &[]).is_ok());
        // A bare name kept runs already: not judged.
        assert_eq!(
            cluster_name("team", "prod.eu", Some("prod.eu"), &[]).as_deref(),
            Ok("prod.eu")
        );
    }

    #[test]
    fn names_eks_refuses_are_found() {
        assert_eq!(eks_name_problem("team-a_prod"), None);
        assert_eq!(eks_name_problem(&"a".repeat(MAX_EKS_NAME)), None);
        let long = eks_name_problem(&"a".repeat(MAX_EKS_NAME + 1)).unwrap();
        assert!(long.contains("101 characters"), "{long}");
        let dot = eks_name_problem("team_prod.eu").unwrap();
        assert!(dot.contains("'.'"), "{dot}");
        assert!(eks_name_problem("_x").is_some());
    }

    #[test]
    fn a_hand_written_apply_may_not_take_another_namespaces_name() {
        let theirs = vars(&[("CLUSTER_NAME", "prod"), ("REGION", "r")]);
        let victim = Holder {
            namespace: "team-a",
            name: "prod-vpc",
            created: at(100),
            variables: Some(&theirs),
        };
        let all = |x: &str| x != "isolated";
        // Another namespace's prefix: refused, whatever exists.
        let prefixed = vars(&[("CLUSTER_NAME", "team-a_prod")]);
        let mut own = Holder {
            namespace: "team-b",
            name: "mine",
            created: at(200),
            variables: Some(&prefixed),
        };
        let message = refusal(&own, [], all).unwrap();
        assert!(
            message.contains("CLUSTER_NAME") && message.contains("namespace team-a"),
            "{message}"
        );
        let vpc = vars(&[("VPC_NAME", "team-a_x")]);
        own.variables = Some(&vpc);
        assert!(refusal(&own, [], all).unwrap().contains("VPC_NAME"));
        // Its own prefix, or a bare name no one holds: allowed.
        let ours = vars(&[("CLUSTER_NAME", "team-b_prod"), ("VPC_NAME", "free")]);
        own.variables = Some(&ours);
        assert_eq!(refusal(&own, [victim], all), None);
        // A bare name an older apply of another namespace holds: refused, without the value.
        let bare = vars(&[("CLUSTER_NAME", "prod")]);
        own.variables = Some(&bare);
        let message = refusal(&own, [victim, own], all).unwrap();
        assert!(
            message.contains("CLUSTER_NAME") && !message.contains("\"prod\""),
            "{message}"
        );
        // ... under VPC_NAME as well.
        let as_vpc = vars(&[("VPC_NAME", "prod")]);
        own.variables = Some(&as_vpc);
        assert!(refusal(&own, [victim], all).is_some());
        // The older holder wins: the victim's own next apply keeps the name.
        let later = Holder {
            namespace: "team-a",
            name: "prod-controlplane",
            created: at(300),
            variables: Some(&theirs),
        };
        own.variables = Some(&bare);
        assert_eq!(refusal(&later, [victim, own, later], all), None);
        // The attacker, older than the victim: the victim's apply is refused instead, as
        // first come; and namespaces that share no ProviderConfig never meet.
        let early = Holder {
            created: at(50),
            ..own
        };
        assert!(refusal(&victim, [early, victim], all).is_some());
        let isolated = Holder {
            namespace: "isolated",
            ..early
        };
        assert_eq!(refusal(&victim, [isolated, victim], all), None);
    }
}
