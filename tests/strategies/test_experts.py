"""Per-domain experts with oracle routing: each experience starts from the fresh memory, every
evaluation reads the evaluated domain's own memory (through the real LMModule.evaluate and the
frozen policy), a finished domain's loss never moves, and the state resumes."""
import copy
from types import SimpleNamespace

import pytest
import torch

from cl_platform.lm_module import LMModule
from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule
from cl_platform.memory_policy import FrozenMemory, StreamMemory
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.strategy import CompositeStrategy, StrategyContext
from strategies.experts import Experts
from strategies.naive import NaiveStrategy

V = 32


def setup(strategy):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, n_layer=2, d_model=32, n_head=2, window=8, fwpkm_layers=[1],
                      fwpkm=FwPKMConfig(num_subkeys=8, d_key=16, d_value=16, topk=4))
    model = FwPKMLM(cfg, WriteRule(chunk=8, lr_values=1.0)).eval()
    return LMModule(model, phase="fast", strategy=strategy, memory_policy=FrozenMemory(), eval_domains=["a", "b"])


def batches(seed, lo, hi, n=3):
    """Domain-like data: tokens from [lo, hi) only, so the two domains write different slots."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(lo, hi, (2, 17), generator=g)
        out.append({"input_ids": x[:, :-1], "targets": x[:, 1:]})
    return out


DATA = {"a": (batches(1, 0, 16), batches(2, 0, 16)), "b": (batches(3, 16, 32), batches(4, 16, 32))}  # (adapt, eval)


def experience(module, t, domain):
    ctx = StrategyContext(model=module.model, experience=t, domain=domain, mode="fast")
    module.strategy.on_experience_start(ctx)
    with torch.no_grad():
        for b in DATA[domain][0]:
            module.model(b["input_ids"])
    module.strategy.on_experience_end(ctx)


def rows(module, order=("a", "b")):
    """The results matrix's rows: evaluation before anything, then after each experience."""
    loaders = {d: DATA[d][1] for d in ("a", "b")}
    out = [module.evaluate(loaders)]
    for t, d in enumerate(order, 1):
        experience(module, t, d)
        out.append(module.evaluate(loaders))
    return out


def test_each_domain_reads_its_own_memory_and_a_finished_domain_never_moves():
    experts, naive = setup(Experts()), setup(NaiveStrategy())
    e, n = rows(experts), rows(naive)
    assert e[0] == n[0]  # nothing trained: every memory is the fresh one
    assert e[1]["a"] == n[1]["a"] and e[1]["b"] == e[0]["b"]  # unseen b reads the fresh memory, not a's
    assert e[1]["b"] != n[1]["b"]  # ...which naive's b does read (the test can tell them apart)
    assert e[2]["a"] == e[1]["a"]  # a's expert after b trained: no forgetting, bit for bit
    assert n[2]["a"] != n[1]["a"]  # naive forgets (b's writes land on a's memory)
    # b's expert is a memory trained on b alone from the fresh state: a model that only saw b.
    only_b = setup(NaiveStrategy())
    only_b.evaluate({"b": DATA["b"][1]})
    experience(only_b, 1, "b")
    assert e[2]["b"] == only_b.evaluate({"b": DATA["b"][1]})["b"]
    # Evaluation leaves the live memory (b's) in place; a's kept expert differs from it.
    live = experts.model.snapshot_memory()
    experts.evaluate({d: DATA[d][1] for d in ("a", "b")})
    assert all(torch.equal(x, y) for s, t in zip(live, experts.model.snapshot_memory()) for x, y in zip(s, t))
    assert not torch.equal(experts.strategy.kept["a"][0].values, live[0].values)
    summary = experts.strategy.summary()
    assert summary["experts"] == ["a", "b"] and summary["bytes"] == 3 * sum(
        t.numel() * t.element_size() for s in live for t in s)


def test_routing_goes_through_lightning_validation_and_the_stream_policy_too():
    # The validation hooks route as evaluate() does (the runner's results rows use them).
    module = setup(Experts())
    rows(module)
    kept_a = module.strategy.kept["a"][0].values.clone()
    module._session = StreamMemory().open(module.model)
    module._sums, module._doc_sums = {}, {}
    for idx, d in enumerate(("a", "b")):
        for i, b in enumerate(DATA[d][1]):
            module.on_validation_batch_start(b, i, idx)
            with torch.no_grad():
                module.validation_step(b, i, idx)
    module.eval_domains = ["a", "b"]
    module.on_validation_epoch_end()
    module.on_validation_end()
    via_stream = dict(module.last_eval)
    module.memory_policy = StreamMemory()
    assert via_stream == module.evaluate({d: DATA[d][1] for d in ("a", "b")})
    # under the stream policy a routed domain writes into the live memory, never into its kept expert
    assert torch.equal(module.strategy.kept["a"][0].values, kept_a)


def test_the_state_resumes_and_bad_setups_are_refused():
    module = setup(Experts())
    experience(module, 1, "a")
    s = Experts()
    s.load_state_dict(copy.deepcopy(module.strategy.state_dict()))
    assert s.training is None and list(s.kept) == ["a"]
    assert all(torch.equal(x, y) for p, q in zip(s.kept["a"], module.strategy.kept["a"]) for x, y in zip(p, q))
    with pytest.raises(ValueError, match="'fast' mode only"):
        Experts().check(module.model.config, "finetune")
    with pytest.raises(ValueError, match="compose at most one"):
        CompositeStrategy([Experts(), Experts()])
    assert CompositeStrategy([NaiveStrategy(), Experts()]).routes_eval_memory


def test_a_recurring_domain_continues_its_own_expert():
    module = setup(Experts())
    experience(module, 1, "a")
    after_a = module.model.snapshot_memory()
    experience(module, 2, "b")
    ctx = StrategyContext(model=module.model, experience=3, domain="a", mode="fast")
    module.strategy.on_experience_start(ctx)
    live = module.model.snapshot_memory()
    assert torch.equal(live[0].values, after_a[0].values) and torch.equal(live[0].keys, after_a[0].keys)
