//! The simulated arbiter: a resource-side store that keeps `last_token` per
//! resource and applies the real `leasefence_core::admit` rule (strict mode).
//!
//! An admitted effect and its token are recorded in one step (the simulation's
//! stand-in for one database transaction), so nothing can separate them. With
//! fencing off the arbiter accepts everything: the control run.

use std::collections::BTreeMap;

use leasefence_core::{FenceMode, ResourceId, Token, admit};

use crate::config::Fencing;
use crate::event::Ctx;
use crate::history::AdmittedEffect;
use crate::net::{Message, Node};

#[derive(Debug)]
pub struct ArbiterNode {
    fencing: Fencing,
    last_token: BTreeMap<ResourceId, Token>,
    /// The resource's "rows": every effect applied, in order.
    effects: BTreeMap<ResourceId, Vec<(Token, u64)>>,
    pub rejected: u64,
}

impl ArbiterNode {
    pub fn new(fencing: Fencing) -> ArbiterNode {
        ArbiterNode {
            fencing,
            last_token: BTreeMap::new(),
            effects: BTreeMap::new(),
            rejected: 0,
        }
    }

    pub fn on_message(&mut self, ctx: &mut Ctx<'_>, client: usize, msg: Message) {
        let Message::Effect {
            req,
            resource,
            token,
            payload,
        } = msg
        else {
            return;
        };
        let current = self.last_token.get(&resource).copied();
        let ok = match self.fencing {
            Fencing::Strict => admit(FenceMode::Strict, &resource, current, token).is_ok(),
            Fencing::Off => true,
        };
        let reply = if ok {
            // The effect and its token land together (one transaction).
            self.last_token.insert(resource.clone(), token);
            self.effects.entry(resource.clone()).or_default().push((token, payload));
            let at_ms = ctx.now;
            ctx.history.admitted.push(AdmittedEffect {
                at_ms,
                resource,
                token,
                client,
                payload,
            });
            Message::Admitted { req }
        } else {
            self.rejected += 1;
            Message::Stale { req }
        };
        ctx.send(Node::Arbiter, Node::Client(client), reply);
    }

    /// How many effects were applied in all.
    pub fn applied(&self) -> usize {
        self.effects.values().map(Vec::len).sum()
    }
}
