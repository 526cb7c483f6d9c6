"""The plan: a profile + languages + target + run directory → ordered stages, each an exact command with
the configuration it depends on, the stages it reads from, and where its ``DONE`` record goes.

    synth:<l> ─ distill:<l> (the pool, features captured) ─┐
                heldout:<l> (held-out prompts, greedy) ────┼─ vocab ─┬─ train:pretrain (first language, every
                                                           │         │  language's distilled data)
                                                           │         └─ train:<l> (finetune from the pretrain
                                                           │            weights on distill:<l>, scored on heldout:<l>)
                                                           └──────────── export ─ calibrate ─ eval ─ report
    (distill.mode=continuation: distill:<l> = seed continuations for the pretrain; finetune on synth:<l>)
    (corpus.enabled: corpus:<l> ─ prefill:<l>, general text and the target's features on its first tokens, which
     train:pretrain reads beside the distilled data)
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from corpus.config import CorpusConfig
from decoder.methods import METHODS
from pipelines.config import Profile
from polyspec.config import load_config
from polyspec.errors import PolyspecError
from polyspec.languages import parse_languages
from polyspec.paths import REPO_ROOT, repo_file
from polyspec.target_registry import resolve_target
from synth.config import DistillConfig, SynthConfig
from train.config import TrainConfig
from vocab.__main__ import parse_sources
from vocab.config import VocabConfig


@dataclass
class Stage:
    name: str  # synth:vi, vocab, train:pretrain, …
    kind: str  # synth | distill | vocab | pretrain | finetune | export | calibrate | eval | report
    cmd: list[str]
    done: Path  # the stage's DONE record
    deps: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)  # what the DONE hash covers besides the command
    check: tuple | None = None  # (pydantic model, yaml path, overrides): validated by dry runs
    data: list[str] = field(default_factory=list)  # repository data files it reads (prompts): in the DONE hash
    # its resumable work (synth stores, trainer checkpoints): a crashed stage's rerun resumes from it, an explicit
    # redo (FROM, FORCE) clears it first — else a finished trainer's last checkpoint would make the redo train nothing
    work: list[Path] = field(default_factory=list)


def repo_path(p: str) -> str:
    """Config paths in profiles are relative to the repository (the commands run from anywhere; in an installed
    wheel ``configs/…`` is the packaged copy: ``polyspec.paths.repo_file``)."""
    if Path(p).is_absolute() or Path.cwd().resolve() == REPO_ROOT.resolve():
        return p
    return str(repo_file(p))


def repo_sources(spec: str) -> str:
    """Local paths of vocab sources (``name…=path`` items, e.g. ``files=configs/vocab/seed-text/{lang}.jsonl``) are
    relative to the repository too."""
    items = [x.strip() for x in spec.split(",") if x.strip()]
    paths = [parse_sources(x)[0].get("path") for x in items]
    return ",".join(x[: -len(p)] + repo_path(p) if p else x for x, p in zip(items, paths))


def build_plan(profile: Profile, langs: list[str], target: str, run: Path) -> list[Stage]:
    py = sys.executable
    run = Path(run)
    profile = profile.model_copy(deep=True)
    for part in (profile.synth, profile.distill, profile.vocab):
        part.config = repo_path(part.config)
    profile.vocab.sources = repo_sources(profile.vocab.sources)
    profile.train.recipe = repo_path(profile.train.recipe)
    args = profile.train.accelerate_args
    if "--config_file" in args:
        args[args.index("--config_file") + 1] = repo_path(args[args.index("--config_file") + 1])
    r = str(run)
    p = profile
    first = langs[0]
    on_policy = p.distill.mode == "on-policy"
    stages: list[Stage] = []
    for lang in langs:
        ov = [f"seed={p.seed}", *p.synth.overrides]
        stages.append(Stage(f"synth:{lang}", "synth",
                            [py, "-m", "synth", "--config", p.synth.config, "--lang", lang, "--n", str(p.synth.n),
                             "--target", target, "--run", r, *ov],
                            run / "synth" / lang / "DONE.json", work=[run / "synth" / lang],
                            check=(SynthConfig, p.synth.config, [f"lang={lang}", f"n={p.synth.n}", f"target={target}", *ov])))
        dov = [f"seed={p.seed}", *p.distill.overrides]
        temps = ",".join(str(t) for t in p.distill.temperatures)
        if on_policy:  # the pool at T = 0 and sampled T, features captured; the held-out prompts greedy
            lim = [f"limit={p.distill.limit}"] if p.distill.limit else []
            # the prompt files they read are hashed too: a changed held-out set or task file redoes them (the pool
            # leaves out every held-out and benchmark turn, so those files shape it as well)
            heldout, tasks = repo_path("synth/data/heldout.jsonl"), repo_path(f"synth/data/tasks/{lang}.yaml")
            pool_files = [tasks, heldout, repo_path("decoder/data/mini_multispecbench.jsonl")]
            for name, prompts, t, extra, deps, files in (("distill", "pool", temps, lim, [f"synth:{lang}"], pool_files),
                                                         ("heldout", "heldout", "0", [], [], [heldout])):
                # the last layer (EAGLE-1) and the three layers EAGLE-3 reads: every profile trains engine drafters
                ov = ["capture_features=true", "feature_layers=eagle3", *extra, *dov]
                stages.append(Stage(f"{name}:{lang}", "distill",
                                    [py, "-m", "synth", "distill", "--config", p.distill.config, "--lang", lang,
                                     "--prompts", prompts, "--out-name", name, "--temperatures", t, "--target", target,
                                     "--run", r, *ov],
                                    run / "synth" / f"{lang}-{name}" / "DONE.json", deps=deps,
                                    work=[run / "synth" / f"{lang}-{name}"],
                                    check=(DistillConfig, p.distill.config, [f"lang={lang}", f"target={target}", *ov]),
                                    data=[f for f in files if Path(f).is_file()]))
            continue
        stages.append(Stage(f"distill:{lang}", "distill",
                            [py, "-m", "synth", "distill", "--config", p.distill.config, "--lang", lang, "--continuation",
                             "--out-name", "pretrain", "--temperatures", temps, "--target", target, "--run", r, *dov],
                            run / "synth" / f"{lang}-pretrain" / "DONE.json", work=[run / "synth" / f"{lang}-pretrain"],
                            check=(DistillConfig, p.distill.config, [f"lang={lang}", f"target={target}", *dov])))
    prefilled = []
    if p.corpus.enabled:  # general text for the pretrain: the corpus, then the target's features on its first tokens
        c = p.corpus
        c.config = repo_path(c.config)
        for lang in langs:
            stages.append(Stage(f"corpus:{lang}", "corpus",
                                [py, "-m", "corpus", "--config", c.config, "--langs", lang, "--target", target, "--run", r,
                                 *c.overrides],
                                run / "corpus" / lang / "DONE.json", work=[run / "corpus" / lang],
                                check=(CorpusConfig, c.config, [f"langs=[{lang}]", f"target={target}", *c.overrides])))
            stages.append(Stage(f"prefill:{lang}", "prefill",
                                [py, "-m", "corpus", "prefill", "--lang", lang, "--target", target, "--run", r,
                                 "--max-tokens", str(c.tokens), "--seq-len", str(c.seq_len)],
                                run / "corpus" / f"{lang}-prefill" / "DONE.json", deps=[f"corpus:{lang}"],
                                work=[run / "corpus" / f"{lang}-prefill"]))
            prefilled.append(f"{r}/corpus/{lang}-prefill/data.jsonl")
    stages.append(Stage("vocab", "vocab",
                        [py, "-m", "vocab", "--config", p.vocab.config, "--langs", ",".join(langs), "--sources",
                         p.vocab.sources, "--target", target, "--run", r,
                         f"mask_sizes=[{','.join(map(str, p.export.sizes))}]", *p.vocab.overrides],
                        run / "vocab" / "DONE.json",  # on-policy: the distilled answers are counted, the held-out
                        deps=[f"{k}:{lang}" for lang in langs  # ones measure coverage
                              for k in (("synth", "distill", "heldout") if on_policy else ("synth",))],
                        check=(VocabConfig, p.vocab.config, [f"mask_sizes={p.export.sizes}", f"sources={_sources(p.vocab.sources)}",
                                                              *p.vocab.overrides])))
    if "--config_file" not in args and "--num_cpu_threads_per_process" not in args:  # accelerate launch would
        # otherwise set OMP_NUM_THREADS=1 for a CPU process: half the training speed on 2 cores (measured)
        procs = int(args[args.index("--num_processes") + 1]) if "--num_processes" in args else 1
        args = [*args, "--num_cpu_threads_per_process", str(max(1, (os.cpu_count() or 1) // procs))]
    pre_name = "distill" if on_policy else "pretrain"
    pre_data = "[" + ",".join([*(f"{r}/synth/{lang}-{pre_name}/data.jsonl" for lang in langs), *prefilled]) + "]"
    captured = ["features=captured"] if on_policy else []
    # the profile's own drafters (train:*), and the EAGLE-3 drafters engines load beside them (train3:*) where the
    # own ones are of another form; an EAGLE-3 pretrain reads one draft vocabulary interleaving every language's
    tracks = [("train", "train", p.train.recipe, p.train.pretrain_overrides, p.train.finetune_overrides)]
    if p.train.engine is not None:
        eng = p.train.engine
        tracks.append(("train3", eng.train_dir, repo_path(eng.recipe), eng.pretrain_overrides, eng.finetune_overrides))
    for prefix, tdir, recipe, pre_extra, fine_extra in tracks:
        launch = [py, "-m", "accelerate.commands.launch", *args, repo_path("train/drafter.py"), "--config", recipe]
        where = [f"train_dir={tdir}"] if tdir != "train" else []
        multi = [f"eagle.vocab_langs=[{','.join(langs)}]"] if is_eagle3(recipe, pre_extra) else []
        pre_ov = [f"lang={first}", f"target={target}", f"run={r}", "stage=pretrain", f"seed={p.seed}", *where,
                  f"data.pretrain={pre_data}", *captured, *multi, *pre_extra]
        stages.append(Stage(f"{prefix}:pretrain", "pretrain", [*launch, *pre_ov],
                            run / tdir / first / "pretrain" / "DONE.json", work=[run / tdir / first / "pretrain"],
                            deps=["vocab", *(f"distill:{lang}" for lang in langs),
                                  *(f"prefill:{lang}" for lang in langs if prefilled)],
                            check=(TrainConfig, recipe, pre_ov)))
        for lang in langs:
            data = [f"data.finetune=[{r}/synth/{lang}-distill/data.jsonl]",  # the held-out answers score it
                    f"data.eval_file=[{r}/synth/{lang}-heldout/data.jsonl]"] if on_policy else []
            ov = [f"lang={lang}", f"target={target}", f"run={r}", "stage=finetune", f"seed={p.seed}", *where,
                  f"init_from={r}/{tdir}/{first}/pretrain/final", *captured, *data, *fine_extra]
            deps = [f"distill:{lang}", f"heldout:{lang}"] if on_policy else [f"synth:{lang}"]
            stages.append(Stage(f"{prefix}:{lang}", "finetune", [*launch, *ov], run / tdir / lang / "DONE.json",
                                work=[run / tdir / lang / "finetune"],
                                deps=[f"{prefix}:pretrain", *deps, "vocab"], check=(TrainConfig, recipe, ov)))
    bundle = run / "export" / "bundle"
    e = p.export
    stages.append(Stage("export", "export",
                        [py, "-m", "export", "--langs", ",".join(langs), "--run", r, "--target", target, "--out", str(bundle),
                         "--sizes", ",".join(map(str, e.sizes)), "--window", str(e.window), "--step", str(e.step),
                         "--offset", str(e.offset)],
                        run / "export" / "DONE.json", deps=[f"train:{lang}" for lang in langs] + ["vocab"]))
    # every profile ships drafters an engine loads: speculators folders (vLLM, SGLang) per language and for the
    # multilingual pretrain, GGUFs where llama.cpp's converter is at hand, and engines.json saying which loads what
    prefix, tdir = ("train3", p.train.engine.train_dir) if p.train.engine is not None else ("train", "train")
    engines = run / "export" / "engines"
    stages.append(Stage("export:engines", "export",
                        [py, "-m", "export", "engines", "--langs", ",".join(langs), "--run", r, "--target", target,
                         "--train-dir", tdir, "--out", str(engines), "--sizes", ",".join(map(str, e.sizes))],
                        engines / "DONE.json",
                        deps=[f"{prefix}:pretrain", *(f"{prefix}:{lang}" for lang in langs), "vocab"]))
    last, scored = "export:engines", []
    if on_policy:  # each language's own engine drafter beside the multilingual one, on the same held-out answers
        stages.append(Stage("score:engines", "export",
                            [py, "-m", "pipelines.score_check", "--run", r, "--engines", str(engines), "--target",
                             target, "--gamma", "4"],
                            run / "export" / "engines-score" / "DONE.json",
                            deps=["export:engines", *(f"heldout:{lang}" for lang in langs)]))
        scored = ["score:engines"]
    if p.calibrate.enabled:
        c = p.calibrate
        stages.append(Stage("calibrate", "calibrate",
                            [py, "-m", "decoder.calibrate", "--bundle", str(bundle), "--target", target,
                             "--sizes", ",".join(map(str, c.sizes)), "--prompts", str(c.prompts),
                             "--max-new-tokens", str(c.max_new_tokens)],
                            run / "calibrate" / "DONE.json", deps=["export", "export:engines"]))
        last = "calibrate"
    ev = p.eval
    unknown = sorted(set(ev.methods) - set(METHODS))
    if unknown:
        raise PolyspecError(f"profile {p.name}: unknown eval methods {unknown}; choose from {', '.join(METHODS)}")
    stages.append(Stage("eval", "eval",
                        [py, "-m", "decoder.bench", "--bundle", str(bundle), "--target", target, "--langs", ",".join(langs),
                         "--methods", ",".join(ev.methods), "--max-new-tokens", str(ev.max_new_tokens),
                         "--repeats", str(ev.repeats), "--out", str(run / "eval"),
                         *(["--engine-bundle", str(engines / "bundle")] if "eagle3" in ev.methods else []),
                         *(["--per-cell", str(ev.per_cell)] if ev.per_cell else []),
                         *(["--questions", repo_path(ev.questions)] if ev.questions else [])],
                        run / "eval" / "DONE.json", deps=[last] if last == "calibrate" else ["export", last]))
    stages.append(Stage("report", "report", [py, "-m", "pipelines", "report", "--run", r],
                        run / "report" / "DONE.json", deps=["eval", *scored]))
    return stages


def is_eagle3(recipe: str, overrides: list[str] | None = None) -> bool:
    """Whether a train recipe (+ overrides) makes EAGLE-3-form drafters: the form vLLM, SGLang and llama.cpp load."""
    cfg = load_config(TrainConfig, recipe, overrides or [])
    return cfg.drafter_type == "eagle" and cfg.eagle.arch == "eagle3"


def engine_drafters(profile: Profile) -> str | None:
    """The recipe whose drafters engines load, or None when the profile would export none."""
    if profile.train.engine is not None:
        eng = profile.train.engine
        return eng.recipe if is_eagle3(repo_path(eng.recipe), eng.finetune_overrides) else None
    return profile.train.recipe if is_eagle3(repo_path(profile.train.recipe), profile.train.finetune_overrides) else None


def _sources(spec: str) -> str:
    return json.dumps(parse_sources(spec))  # the vocab CLI's own parser: the same rules as the command


def validate_plan(stages: list[Stage], profile: Profile, target: str, langs: list[str]) -> list[str]:
    """Everything a dry run can check without weights or GPUs; returns what was checked."""
    checked = [f"target {resolve_target(target).name} (registry entry)",
               f"languages {', '.join(lang.code for lang in parse_languages(','.join(langs)))}"]
    recipe = engine_drafters(profile)
    if recipe is None:
        raise PolyspecError(f"profile {profile.name}: its export would hold no drafter an engine loads — the train "
                            f"recipe makes no EAGLE-3 drafters and train.engine is not set")
    checked.append(f"engine drafters (EAGLE-3): {recipe}")
    for st in stages:
        if st.check:
            model, path, ov = st.check
            if not Path(path).is_file():
                raise PolyspecError(f"{st.name}: config file {path} not found")
            load_config(model, path, ov)
            checked.append(f"{st.name}: {path} + {len(ov)} overrides valid ({model.__name__})")
    args = profile.train.accelerate_args
    if "--config_file" in args:
        cfg = args[args.index("--config_file") + 1]
        if not Path(cfg).is_file():
            raise PolyspecError(f"accelerate config {cfg} not found")
        checked.append(f"accelerate config {cfg}")
        ds = (yaml.safe_load(Path(cfg).read_text()) or {}).get("deepspeed_config", {}).get("deepspeed_config_file")
        if ds:
            if not Path(ds).is_file():
                raise PolyspecError(f"DeepSpeed config {ds} (from {cfg}) not found")
            checked.append(f"DeepSpeed config {ds}")
    return checked
