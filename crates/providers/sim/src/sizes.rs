//! The VM sizes of the simulated and local providers: each `providerSpec.size` maps to a number of CPUs and an
//! amount of memory (spec 000: "Each size maps to a number of CPUs and memory size").
//!
//! | size | CPUs | memory |
//! |---|---|---|
//! | `xsmall` | 1 | 2Gi |
//! | `small` | 2 | 4Gi |
//! | `medium` | 4 | 8Gi |
//! | `large` | 8 | 16Gi |

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A VM size: its name in `providerSpec.size`, its CPUs and its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Size {
    /// The name written in `providerSpec.size`.
    pub name: &'static str,
    /// Number of CPUs.
    pub cpu: u32,
    /// Memory in GiB.
    pub memory_gib: u32,
}

impl Size {
    /// The CPUs as a Kubernetes quantity (`"2"`).
    pub fn cpu_quantity(&self) -> Quantity {
        Quantity(self.cpu.to_string())
    }

    /// The memory as a Kubernetes quantity (`"4Gi"`).
    pub fn memory_quantity(&self) -> Quantity {
        Quantity(format!("{}Gi", self.memory_gib))
    }
}

/// 1 CPU, 2 GiB.
pub const XSMALL: Size = Size {
    name: "xsmall",
    cpu: 1,
    memory_gib: 2,
};
/// 2 CPUs, 4 GiB.
pub const SMALL: Size = Size {
    name: "small",
    cpu: 2,
    memory_gib: 4,
};
/// 4 CPUs, 8 GiB.
pub const MEDIUM: Size = Size {
    name: "medium",
    cpu: 4,
    memory_gib: 8,
};
/// 8 CPUs, 16 GiB.
pub const LARGE: Size = Size {
    name: "large",
    cpu: 8,
    memory_gib: 16,
};

/// Every size, smallest first.
pub const ALL: [Size; 4] = [XSMALL, SMALL, MEDIUM, LARGE];

/// The size of this name, if there is one.
pub fn lookup(name: &str) -> Option<Size> {
    ALL.into_iter().find(|size| size.name == name)
}

/// The names of every size, comma-separated, smallest first (`xsmall, small, medium, large`), as error messages
/// list them.
pub fn known_names() -> String {
    ALL.map(|size| size.name).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_size_maps_to_cpus_and_memory() {
        let table: Vec<(&str, String, String)> = ALL
            .iter()
            .map(|s| (s.name, s.cpu_quantity().0, s.memory_quantity().0))
            .collect();
        assert_eq!(
            table,
            [
                ("xsmall", "1".into(), "2Gi".into()),
                ("small", "2".into(), "4Gi".into()),
                ("medium", "4".into(), "8Gi".into()),
                ("large", "8".into(), "16Gi".into()),
            ]
        );
        assert_eq!(lookup("medium"), Some(MEDIUM));
        assert_eq!(lookup("huge"), None);
        assert_eq!(known_names(), "xsmall, small, medium, large");
    }
}
