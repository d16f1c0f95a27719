"""The gate's checks, one module per family of checks (the registry, gate/registry.py, says
which function each check is and what it needs; the table in docs/gate.md names each check's
module):

    inputs.py         inputs, overlength, shapes, raw_logits: the input contract, the output
    invariance.py     determinism, batch_independence, causal, prefix: relations of the forward
    routing.py        routing_independence, expert_gradients: routed experts
    attention.py      attention_rows          window.py   window: each layer's declared span
    weights.py        params, tying, tying_grad, dead_parameters (reach.py: what the loss reads)
    reference.py      oracle: the float64 oracle on the weights (spec.py: a declared spec's
                      module, stress.py: the stress, quiet and capped weights)
    kv_cache.py       kv_cache                generation.py  padding, grad_causal
    training.py       train_mode, autocast (trainshape.py: the probe at the run's own length)
    checkpointing.py  checkpointing           packing.py     packing
    model_loss.py     model_loss              router_loss.py router_aux_loss
    alignment.py      loss_alignment

Each check is a function of a `gate.subject.Subject` returning a `gate.result.CheckResult`; the
engine (runner, registry, facts, subject, report) lives one level up, in gate/.
"""
