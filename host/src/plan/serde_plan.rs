//! How a [`Plan`](super::Plan)'s schedule and costs cross serde: the schedule as its JSON file form
//! (read back through the same reader and validated), the costs checked when read.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::cost::CostModel;
use crate::schedule::{format, validate::validate, Schedule};

/// `#[serde(with = ...)]` for a schedule: its JSON file form as a nested value.
pub(super) mod schedule {
    use super::*;

    /// Writes `s` as the schedule JSON file's object.
    pub fn serialize<S: Serializer>(s: &Schedule, out: S) -> Result<S::Ok, S::Error> {
        let value: Value =
            serde_json::from_str(&format::to_json(s)).map_err(serde::ser::Error::custom)?;
        value.serialize(out)
    }

    /// Reads the schedule JSON file's object and validates the schedule.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Schedule, D::Error> {
        let value = Value::deserialize(d)?;
        let s = format::from_json(&value.to_string()).map_err(D::Error::custom)?;
        validate(&s).map_err(|e| D::Error::custom(format!("schedule `{}`: {e}", s.name)))?;
        Ok(s)
    }
}

/// Reads a cost model and checks every field.
pub(super) fn checked_cost<'de, D: Deserializer<'de>>(d: D) -> Result<CostModel, D::Error> {
    let m = CostModel::deserialize(d)?;
    m.check().map_err(D::Error::custom)?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use crate::cost::{CostFile, LayerCost, LinkCost};
    use crate::plan::{best_partition, Plan};
    use crate::schedule::{families, Params};

    fn plan() -> Plan {
        let layers = (0..4)
            .map(|i| LayerCost::new(format!("l{i}"), 1.0, 0.5 + i as f64, 1.0))
            .collect();
        let costs = CostFile {
            layers,
            transfer: LinkCost::default(),
            overlap_share: 1.0,
            meta: serde_json::Value::Null,
        };
        let s = families::generate("dualpipev", &Params::new(2, 4)).unwrap();
        best_partition(&costs, &s, None).unwrap()
    }

    #[test]
    fn a_plan_round_trips_through_json() {
        let p = plan();
        let text = serde_json::to_string(&p).unwrap();
        // Free transfers are written as null and read back as infinity.
        assert!(text.contains(r#""bandwidth":null"#), "{text}");
        let back: Plan = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn a_broken_plan_is_refused_when_read() {
        let mut v = serde_json::to_value(plan()).unwrap();
        v["cost"]["stages"][0]["forward"] = serde_json::json!(-1.0);
        let e = serde_json::from_value::<Plan>(v).unwrap_err().to_string();
        assert!(e.contains("stages[0].forward"), "{e}");
        let mut v = serde_json::to_value(plan()).unwrap();
        v["schedule"]["actions"][0] = serde_json::json!([]);
        assert!(serde_json::from_value::<Plan>(v).is_err());
    }
}
