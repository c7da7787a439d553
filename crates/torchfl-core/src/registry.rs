//! Which plugin serves each operator.
//!
//! Several plugins may implement the same operator (a vendor's base plugin
//! and a plugin of fused kernels that overrides a few). The winner for an
//! operator is the registration with the **highest priority**; among equal
//! priorities, the **earliest registration** wins, so registering another
//! plugin never silently re-routes operators that were already served at
//! the same priority. Registering a plugin again updates its priority and
//! keeps its place in the registration order.
//!
//! Lookups take no lock: readers load an immutable snapshot (`arc-swap`),
//! writers (registrations, which are rare) build a new snapshot under a
//! mutex and publish it atomically.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::plugin::{OpKernel, Plugin};

/// One plugin's kernel for one operator.
#[derive(Debug)]
pub struct Registration {
    /// The plugin whose kernel this is; kept alive by the registration.
    pub plugin: Arc<Plugin>,
    /// The priority the plugin was registered at; the highest serves.
    pub priority: i32,
    /// Registration order of the plugin (0 = first).
    pub order: u64,
    /// The plugin's kernel for the operator.
    pub kernel: OpKernel,
}

type Candidates = Arc<[Arc<Registration>]>;

#[derive(Debug, Default)]
struct Writer {
    /// (plugin, priority, registration order) of each registered plugin.
    plugins: Vec<(Arc<Plugin>, i32, u64)>,
    next_order: u64,
}

/// The operator registry. See the module docs for the routing rule.
#[derive(Debug)]
pub struct OpRegistry {
    snapshot: ArcSwap<HashMap<String, Candidates>>,
    writer: Mutex<Writer>,
}

impl Default for OpRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl OpRegistry {
    /// A registry with no plugins: every lookup misses.
    pub fn new() -> Self {
        Self { snapshot: ArcSwap::from_pointee(HashMap::new()), writer: Mutex::new(Writer::default()) }
    }

    /// Registers every operator of `plugin` at `priority` (higher wins).
    pub fn register(&self, plugin: &Arc<Plugin>, priority: i32) {
        let mut writer = self.writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let existing = writer.plugins.iter().position(|(p, _, _)| Arc::ptr_eq(p, plugin));
        match existing {
            Some(i) => writer.plugins[i].1 = priority,
            None => {
                let order = writer.next_order;
                writer.next_order += 1;
                writer.plugins.push((Arc::clone(plugin), priority, order));
            }
        }
        let mut map: HashMap<String, Vec<Arc<Registration>>> = HashMap::new();
        for (plugin, priority, order) in &writer.plugins {
            for op in plugin.ops() {
                map.entry(op.name.clone()).or_default().push(Arc::new(Registration {
                    plugin: Arc::clone(plugin),
                    priority: *priority,
                    order: *order,
                    kernel: op.clone(),
                }));
            }
        }
        let map = map
            .into_iter()
            .map(|(name, mut regs)| {
                regs.sort_by_key(|r| (std::cmp::Reverse(r.priority), r.order));
                (name, Candidates::from(regs))
            })
            .collect();
        self.snapshot.store(Arc::new(map));
    }

    /// The registered plugins in registration order (the first one is the
    /// device's runtime plugin when the registry belongs to a device).
    pub fn plugins(&self) -> Vec<Arc<Plugin>> {
        let writer = self.writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        writer.plugins.iter().map(|(plugin, _, _)| Arc::clone(plugin)).collect()
    }

    /// The registration that serves `op`, if any. Lock-free.
    pub fn lookup(&self, op: &str) -> Option<Arc<Registration>> {
        self.snapshot.load().get(op).and_then(|c| c.first().cloned())
    }

    /// Every registration for `op`, the winner first.
    pub fn candidates(&self, op: &str) -> Vec<Arc<Registration>> {
        self.snapshot.load().get(op).map(|c| c.to_vec()).unwrap_or_default()
    }

    /// The name of the plugin serving `op`.
    pub fn served_by(&self, op: &str) -> Option<String> {
        self.lookup(op).map(|r| r.plugin.name().to_owned())
    }

    /// All operators served, sorted.
    pub fn ops(&self) -> Vec<String> {
        let mut ops: Vec<String> = self.snapshot.load().keys().cloned().collect();
        ops.sort();
        ops
    }

    /// Operators `plugin` serves, sorted.
    pub fn ops_served_by(&self, plugin: &Plugin) -> Vec<String> {
        let snapshot = self.snapshot.load();
        let mut ops: Vec<String> = snapshot
            .iter()
            .filter(|(_, c)| c.first().is_some_and(|r| std::ptr::eq(r.plugin.as_ref(), plugin)))
            .map(|(name, _)| name.clone())
            .collect();
        ops.sort();
        ops
    }

    /// Operators where `plugin` wins over at least one other plugin, with
    /// the names of the plugins it overrides.
    pub fn overrides(&self, plugin: &Plugin) -> Vec<(String, Vec<String>)> {
        let snapshot = self.snapshot.load();
        let mut out: Vec<(String, Vec<String>)> = snapshot
            .iter()
            .filter(|(_, c)| c.len() > 1 && std::ptr::eq(c[0].plugin.as_ref(), plugin))
            .map(|(name, c)| (name.clone(), c[1..].iter().map(|r| r.plugin.name().to_owned()).collect()))
            .collect();
        out.sort();
        out
    }
}
