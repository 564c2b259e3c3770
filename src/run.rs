//! `fork run`: one command in the sandbox, for debugging policies and for benchmarks.

use crate::cli::{exit, load_policy, CliError, RunArgs};
use crate::sandbox::{Outcome, Sandbox, SANDBOX_PATH, WORKSPACE};
use serde::Serialize;

/// The JSON written by `--report`.
#[derive(Debug, Serialize)]
pub struct RunReport<'a> {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub budget_exceeded: Option<&'static str>,
    pub limits: &'a crate::policy::Budgets,
    pub usage: &'a crate::budget::Usage,
    pub isolation: &'a crate::sandbox::Isolation,
    pub run_id: &'a str,
    pub interrupted: bool,
}

/// The environment a successor gets: a fixed base, the FORK_* variables, and what the
/// policy passes or sets. Nothing else of the supervisor's environment.
pub fn successor_env(
    policy: &crate::policy::Policy,
    extra: &[(String, String)],
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), SANDBOX_PATH.into()),
        ("HOME".into(), format!("{WORKSPACE}/home")),
        ("TMPDIR".into(), "/tmp".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("FORK_WORKSPACE".into(), WORKSPACE.into()),
    ];
    let mut set = |k: &str, v: String| {
        if let Some(e) = env.iter_mut().find(|(ek, _)| ek == k) {
            e.1 = v;
        } else {
            env.push((k.to_string(), v));
        }
    };
    for k in &policy.environment.pass {
        if let Ok(v) = std::env::var(k) {
            set(k, v);
        }
    }
    for (k, v) in &policy.environment.set {
        set(k, v.clone());
    }
    for (k, v) in extra {
        set(k, v.clone());
    }
    env
}

pub fn run(a: RunArgs) -> Result<i32, CliError> {
    let policy = load_policy(a.policy.as_deref(), &a.budget)?;
    if let Some(w) = &a.workspace {
        if !w.is_dir() {
            return Err(CliError::from((
                exit::USAGE,
                format!("--workspace {}: not a directory", w.display()),
            )));
        }
    }
    let mut policy = policy;
    // The metered model gateway, when the policy has one (its key file stays hidden).
    let gateway = match policy.gateway.clone() {
        None => None,
        Some(cfg) => {
            let creds = cfg.load_credentials().map_err(|e| {
                CliError::from((exit::BAD_INPUT, format!("the model gateway: {e}")))
            })?;
            if let Some(f) = &cfg.credentials_file {
                policy.filesystem.hide.push(f.clone());
            }
            let meter = crate::gateway::Meter::new(policy.budgets.api_cost_usd);
            let url = cfg.task_url();
            let port = cfg.port();
            let gw = crate::gateway::Gateway::new(cfg, creds, meter.clone()).map_err(|e| {
                CliError::from((exit::BAD_INPUT, format!("the model gateway: {e}")))
            })?;
            Some((gw, meter, url, port))
        }
    };
    let mut sb = Sandbox::prepare(&policy).map_err(|e| CliError::from((e.exit_code(), e)))?;
    if let Some(w) = &a.workspace {
        crate::fork::workspace::copy_tree(w, &sb.workspace(), &[]).map_err(|e| {
            CliError::from((exit::INTERNAL, format!("copying --workspace in: {e}")))
        })?;
    }
    let mut extra = vec![("FORK_RUN_ID".to_string(), sb.run_id().to_string())];
    if let Some((_, _, url, _)) = &gateway {
        extra.push(("FORK_MODEL_URL".to_string(), url.clone()));
    }
    let env = successor_env(&policy, &extra);
    let mut doors = crate::sandbox::Doors::default();
    for f in &policy.network.forward {
        let addr = crate::policy::parse_forward(f).map_err(|m| {
            CliError::from((
                exit::BAD_INPUT,
                format!("{}: network.forward: {m}", policy.origin),
            ))
        })?;
        doors.doors.push(crate::sandbox::Door::forward(addr));
    }
    if let Some((gw, meter, _, port)) = gateway {
        doors.doors.push(crate::sandbox::Door {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            serve: Box::new(move |l| Box::pin(gw.serve(l))),
        });
        doors.cost = Some(meter);
    }
    let outcome: Outcome = sb
        .run_in(
            &a.command,
            &env,
            std::path::Path::new(crate::sandbox::WORKSPACE),
            None,
            doors,
        )
        .map_err(|e| CliError::from((e.exit_code(), e)))?;
    if let Some(w) = &a.workspace {
        // The successor is dead, but it may have left its workspace replaced by a symlink.
        let ws = sb.workspace();
        let intact = std::fs::symlink_metadata(&ws)
            .map(|m| m.is_dir())
            .unwrap_or(false);
        if !intact {
            eprintln!(
                "fork: the workspace is no longer a directory (replaced by a link?): not copying it back to {}",
                w.display()
            );
        } else if let Err(e) = crate::fork::workspace::copy_tree(&ws, w, &["home".to_string()]) {
            eprintln!("fork: copying the workspace back to {}: {e}", w.display());
        }
    }
    let run_id = sb.run_id().to_string();
    if let Some(m) = &outcome.exec_error {
        eprintln!("fork: {m}");
    }
    if let Some(b) = outcome.budget_exceeded {
        eprintln!(
            "fork: budget exceeded: {}",
            crate::budget::describe(b, &policy.budgets, &outcome.usage)
        );
    }
    if let Some(path) = &a.report {
        let rep = RunReport {
            exit_code: outcome.exit_code,
            signal: outcome.signal,
            budget_exceeded: outcome.budget_exceeded.map(|b| b.as_str()),
            limits: &policy.budgets,
            usage: &outcome.usage,
            isolation: &outcome.isolation,
            run_id: &run_id,
            interrupted: outcome.interrupted,
        };
        let json =
            serde_json::to_vec_pretty(&rep).map_err(|e| CliError::from((exit::INTERNAL, e)))?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, &json)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| {
                CliError::from((
                    exit::INTERNAL,
                    format!("writing report {}: {e}", path.display()),
                ))
            })?;
    }
    sb.destroy()
        .map_err(|e| CliError::from((exit::INTERNAL, e)))?;
    Ok(outcome.exit_code)
}
