//! The creation act: provider calls (GetMachineStatus, CreateMachine, InitializeMachine) as `mcm_core::creation`
//! decides, the record of the VM on the machine, and the status writes of each step.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) fn request_parts(
    machine: &Machine,
    class: &MachineClass,
    secret: &Secret,
) -> (Machine, MachineClass, Secret) {
    (machine.clone(), class.clone(), secret.clone())
}

/// Why CreateMachine cannot be called with the class's secret.
pub(super) enum BootSecretError {
    /// The secret itself is wrong and has to change: recorded through `creation::secret_problem`.
    Secret(userdata::UserDataError),
    /// The bootstrap token could not be made: recorded as the failure of the CreateMachine call.
    Call(DriverError),
}

/// The secret passed to CreateMachine: userData rendered for the machine (and its bootstrap token, created in the
/// target cluster when the userData asks for one). The rendered userData and the token are added to `redactor`:
/// a provider's message may quote them.
pub(super) async fn boot_secret(
    machine: &Machine,
    class: &MachineClass,
    secret: &Secret,
    ctx: &Context,
    redactor: &mut Redactor,
) -> Result<Secret, BootSecretError> {
    let name = machine.name_any();
    let user_data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(keys::user_data::KEY))
        .map(|b| b.0.clone());
    let Some(user_data) = user_data else {
        return Err(BootSecretError::Secret(
            userdata::UserDataError::MissingUserData {
                machine: name,
                class: class.name_any(),
                key: keys::user_data::KEY,
            },
        ));
    };
    let token = if userdata::wants_bootstrap_token(&user_data) {
        let random: [u8; 32] = rand::random();
        let token = userdata::BootstrapToken::for_machine(&name, &random)
            .map_err(|err| BootSecretError::Call(DriverError::internal(format!("bootstrap token: {err}"))))?;
        if let Some(target) = &ctx.target {
            let expires = jiff::Timestamp::now()
                + jiff::SignedDuration::try_from(ctx.config.settings.machine_creation_timeout)
                    .unwrap_or_default();
            let object = userdata::bootstrap_token_secret(
                &token,
                &name,
                expires,
                &ctx.config.settings.bootstrap_token_auth_extra_groups,
            );
            let api: Api<Secret> = Api::namespaced(target.clone(), "kube-system");
            match api.create(&PostParams::default(), &object).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    api.replace(&token.secret_name(), &PostParams::default(), &object)
                        .await
                        .ok();
                }
                Err(err) => {
                    return Err(BootSecretError::Call(DriverError::new(
                        MachineCode::Unavailable,
                        format!("creating the bootstrap token: {err}"),
                    )));
                }
            }
        }
        redactor.add_bootstrap_token(&token);
        Some(token)
    } else {
        None
    };
    let rendered = userdata::render_user_data(&user_data, &name, token.as_ref());
    redactor.add(&rendered);
    let mut secret = secret.clone();
    secret
        .data
        .get_or_insert_with(BTreeMap::new)
        .insert(keys::user_data::KEY.to_owned(), ByteString(rendered));
    Ok(secret)
}

#[allow(clippy::too_many_lines)] // one loop over the creation steps, each step a short arm
pub(super) async fn create(
    machine: &Machine,
    class: &MachineClass,
    secret: &Secret,
    redactor: &Redactor,
    ctx: &Context,
    now: jiff::Timestamp,
) -> Result<Action, Error> {
    let name = machine.name_any();
    let mut machine = machine.clone();
    // Learns the rendered userData and the bootstrap token once CreateMachine is called with them.
    let mut redactor = redactor.clone();
    let mut last: Option<CallOutcome> = None;
    // A problem of the class's secret found instead of calling CreateMachine: the next step records it.
    let mut secret_problem: Option<userdata::UserDataError> = None;
    for _ in 0..8 {
        let attempts = ctx.memory.attempts(&name);
        let node_ready = node_ready(&machine, ctx);
        let input = CreationInput {
            machine: &machine,
            settings: &ctx.config.settings,
            now,
            has_target_cluster: ctx.target.is_some(),
            failures: attempts
                .counting(secret_problem.is_some() || last.as_ref().is_some_and(CallOutcome::failed)),
            random: rand::random(),
            redactor: &redactor,
            node_ready,
        };
        let step = match secret_problem.take() {
            Some(problem) => creation::secret_problem(&input, &problem.to_string()),
            None => creation::decide(&input, last.as_ref()),
        };
        let (m, c, s) = request_parts(&machine, class, secret);
        last = match step {
            CreationStep::Skip => return Ok(Action::await_change()),
            CreationStep::CallGetMachineStatus => {
                let fingerprint = ctx.fingerprint(&machine, class);
                if let Some(wait) =
                    attempts.provider_wait(&machine, &ctx.config.settings, node_ready, now, &fingerprint)
                {
                    // A failed call backs off or waits for a change; the CrashLoopBackOff deadline still fires.
                    return Ok(Action::requeue(wait));
                }
                Some(CallOutcome::GetMachineStatus(
                    ctx.driver
                        .get_machine_status(&GetMachineStatusRequest {
                            machine: m,
                            machine_class: c,
                            secret: s,
                        })
                        .await,
                ))
            }
            CreationStep::CallCreateMachine => {
                let result = match boot_secret(&machine, class, secret, ctx, &mut redactor).await {
                    Ok(boot) => {
                        ctx.driver
                            .create_machine(&CreateMachineRequest {
                                machine: m,
                                machine_class: c,
                                secret: boot,
                            })
                            .await
                    }
                    Err(BootSecretError::Call(err)) => Err(err),
                    Err(BootSecretError::Secret(problem)) => {
                        // No call was made: nothing for a crash point, the next step records the problem.
                        secret_problem = Some(problem);
                        last = None;
                        continue;
                    }
                };
                let node_exists = result.as_ref().is_ok_and(|r| ctx.node(&r.node_name).is_some());
                if let Ok(created) = &result {
                    tracing::info!(machine = %name, node = %created.node_name, provider_id = %created.provider_id, "machine created");
                    ctx.recorder
                        .record(&machine, EventType::Normal, "Created", "Created the machine's VM")
                        .await;
                }
                Some(CallOutcome::CreateMachine { result, node_exists })
            }
            CreationStep::CallInitializeMachine { record, vm } => {
                if let Some(record) = record {
                    machine = apply_record(ctx, &machine, &record).await?;
                    crash_point!(CreateRecord, &name);
                }
                let (m, c, s) = request_parts(&machine, class, secret);
                let started = std::time::Instant::now();
                let result = ctx
                    .driver
                    .initialize_machine(&InitializeMachineRequest {
                        machine: m,
                        machine_class: c,
                        secret: s,
                    })
                    .await;
                if let (Some(metrics), Ok(_)) = (&ctx.metrics, &result) {
                    metrics.machine_step(Step::Initialize, &machine, None, Some(class), started.elapsed());
                }
                Some(CallOutcome::InitializeMachine { vm, result })
            }
            CreationStep::Finish { record, status } => {
                if let Some(record) = record {
                    machine = apply_record(ctx, &machine, &record).await?;
                    crash_point!(CreateFinishRecord, &name);
                }
                if let Some(status) = status {
                    write_status(ctx, &machine, &status).await?;
                    // The creation flow is over (phase Pending, or Available without a target cluster): the
                    // reference's create duration, from the machine's creation.
                    if let (Some(metrics), Some(created)) =
                        (&ctx.metrics, &machine.metadata.creation_timestamp)
                        && status.phase().is_some_and(|p| Some(p) != machine.phase())
                    {
                        let took = crate::metrics::elapsed(created.0, jiff::Timestamp::now());
                        metrics.machine_step(Step::Create, &machine, None, Some(class), took);
                    }
                }
                ctx.memory.change(&name, Attempts::creation_done);
                return Ok(Action::requeue(ctx.config.settings.retry.await_change_resync));
            }
            CreationStep::RecordError {
                status,
                retry,
                requeue_after,
                method,
                code,
            } => {
                // The back-off runs from the failure, not from the start of the pass (earlier calls of the pass
                // took time): a retry never comes sooner than the policy says.
                let failed_at = jiff::Timestamp::now().max(now);
                let fingerprint = ctx.fingerprint(&machine, class);
                ctx.memory.change(&name, |attempts| {
                    attempts.call_failed(retry, failed_at, fingerprint);
                });
                write_status(ctx, &machine, &status).await?;
                let message = status.description_text();
                ctx.recorder
                    .record(
                        &machine,
                        EventType::Warning,
                        "ProviderError",
                        &descriptions::call_failed_event(method, code, message),
                    )
                    .await;
                return Ok(requeue_after.map_or_else(Action::await_change, Action::requeue));
            }
            CreationStep::DeleteStaleVm { vm, status } => {
                let mut stale = machine.clone();
                stale.spec.provider_id.clone_from(&vm.provider_id);
                let (_, c, s) = request_parts(&stale, class, secret);
                if let Err(err) = ctx
                    .driver
                    .delete_machine(&DeleteMachineRequest {
                        machine: stale,
                        machine_class: c,
                        secret: s,
                    })
                    .await
                {
                    tracing::warn!(machine = %name, error = %redactor.redact(&err.message), "could not delete a stale VM");
                }
                write_status(ctx, &machine, &status).await?;
                return Ok(Action::await_change());
            }
            CreationStep::Fail { status } => {
                write_status(ctx, &machine, &status).await?;
                let message = status.description_text();
                ctx.recorder
                    .record(&machine, EventType::Warning, "Failed", message)
                    .await;
                return Ok(Action::await_change());
            }
        };
        crash_point!(call last.as_ref(), &name);
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// Whether the machine's node (by its `node` label) exists in the target cluster and is healthy.
pub(super) fn node_ready(machine: &Machine, ctx: &Context) -> bool {
    machine
        .labels()
        .get(keys::labels::NODE)
        .filter(|n| !n.is_empty())
        .and_then(|n| ctx.node(n))
        .and_then(|node| {
            node.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .map(|conditions| {
                    mcm_core::health::is_healthy(conditions, &ctx.config.settings.node_conditions)
                })
        })
        .unwrap_or(false)
}

/// Records the VM on the machine (providerID, `node` label, priority annotation) and notes the write, so that a
/// cache that has not seen it yet is not decided on again. Returns the machine as written.
pub(super) async fn apply_record(
    ctx: &Context,
    machine: &Machine,
    record: &creation::VmRecord,
) -> Result<Machine, Error> {
    let written = ctx
        .machine_api()
        .patch(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(record.merge_patch()),
        )
        .await?;
    let key = format!("machine/{}", machine.name_any());
    ctx.wrote(
        &key,
        machine.resource_version(),
        written.resource_version().as_deref(),
    );
    Ok(written)
}

/// Whether the provider says the machine's recorded VM does not exist (GetMachineStatus NotFound). Any other answer,
/// errors included, is not taken as a vanished VM.
pub(super) async fn vm_vanished(
    machine: &Machine,
    class: &MachineClass,
    secret: &Secret,
    ctx: &Context,
) -> bool {
    let (machine, machine_class, secret) = request_parts(machine, class, secret);
    let result = ctx
        .driver
        .get_machine_status(&GetMachineStatusRequest {
            machine,
            machine_class,
            secret,
        })
        .await;
    matches!(result, Err(err) if err.code == MachineCode::NotFound)
}
