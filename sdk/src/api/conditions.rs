use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Finds a condition by type in a `conditions` list.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether a condition of this type is present with status `True`.
pub fn is_condition_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == "True")
}
