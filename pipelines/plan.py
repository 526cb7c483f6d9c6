"""The plan: a profile + languages + target + run directory → ordered stages, each an exact command
with the configuration it depends on, the stages it reads from, and where its ``DONE`` record goes.

    synth:<l> ─ distill:<l> (the pool, features captured) ─┐
                heldout:<l> (held-out prompts, greedy) ────┼─ vocab ─┬─ train:pretrain (1)
                                                           │         └─ train:<l> (2)
                                                           └───── export ─ calibrate ─ eval ─ report
    (1) first language, every language's distilled data
    (2) finetune from the pretrain weights on distill:<l>, scored on heldout:<l>
    (distill.mode=continuation: distill:<l> = seed continuations for the pretrain; finetune on
     synth:<l>)
    (corpus.enabled: corpus:<l> ─ prefill:<l>, general text and the target's features on its first
     tokens, which train:pretrain reads beside the distilled data)
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
from pipelines.config import Profile, TrainStage
from polyspec.config import load_config
from polyspec.drafter_kind import DrafterKind
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
    # repository data files it reads (prompts): in the DONE hash
    data: list[str] = field(default_factory=list)
    # its resumable work (synth stores, trainer checkpoints): a crashed stage's rerun resumes from
    # it, an explicit redo (FROM, FORCE) clears it first — else a finished trainer's last checkpoint
    # would make the redo train nothing
    work: list[Path] = field(default_factory=list)


def repo_path(p: str) -> str:
    """Config paths in profiles are relative to the repository (the commands run from anywhere; in
    an installed wheel ``configs/…`` is the packaged copy: ``polyspec.paths.repo_file``)."""
    if Path(p).is_absolute() or Path.cwd().resolve() == REPO_ROOT.resolve():
        return p
    return str(repo_file(p))


def repo_sources(spec: str) -> str:
    """Local paths of vocab sources (``name…=path`` items, e.g.
    ``files=configs/vocab/seed-text/{lang}.jsonl``) are relative to the repository too."""
    items = [x.strip() for x in spec.split(",") if x.strip()]
    paths = [parse_sources(x)[0].get("path") for x in items]
    return ",".join(x[: -len(p)] + repo_path(p) if p else x for x, p in zip(items, paths))


@dataclass
class _PlanInputs:
    """What every stage builder reads: the profile (its repository paths resolved), the languages,
    the target and the run directory."""

    profile: Profile
    langs: list[str]
    target: str
    run: Path
    first_lang: str  # the pretrain is named for it: <run>/train/<first_lang>/pretrain
    python: str  # the interpreter every stage's command runs

    def command(self, module: str, *args: str) -> list[str]:
        return [self.python, "-m", module, *args]

    @property
    def on_policy(self) -> bool:
        return self.profile.distill.mode == "on-policy"

    @property
    def run_arg(self) -> str:  # the run directory as the commands spell it
        return str(self.run)

    @property
    def target_run_args(self) -> list[str]:
        """``--target <target> --run <run>``, as the data stages' commands pass them."""
        return ["--target", self.target, "--run", self.run_arg]

    @property
    def export_args(self) -> list[str]:
        """``--langs <langs> --run <run> --target <target>``, as both export commands start."""
        return ["--langs", self.langs_arg, "--run", self.run_arg, "--target", self.target]

    @property
    def langs_arg(self) -> str:
        return ",".join(self.langs)

    @property
    def bundle(self) -> Path:
        return self.run / "export" / "bundle"

    @property
    def engines(self) -> Path:
        return self.run / "export" / "engines"


@dataclass
class _TrainTrack:
    """One set of drafters to train: a multilingual pretrain, then a finetune per language."""

    prefix: str  # stage names: <prefix>:pretrain, <prefix>:<lang>
    train_dir: str  # where under the run: <run>/<train_dir>/<lang>/
    recipe: str
    pretrain_overrides: list[str]
    finetune_overrides: list[str]
    launch: list[str]  # python -m accelerate.commands.launch … train/drafter.py --config <recipe>


def build_plan(profile: Profile, langs: list[str], target: str, run: Path) -> list[Stage]:
    """The profile's stages for these languages, target and run directory, in the order they run."""
    plan = _PlanInputs(
        _resolve_paths(profile),
        langs,
        target,
        Path(run),
        first_lang=langs[0],
        python=sys.executable,
    )
    stages: list[Stage] = []
    for lang in langs:
        stages.append(_synth_stage(plan, lang))
        stages += _distill_stages(plan, lang)
    if plan.profile.corpus.enabled:  # general text for the pretrain: the corpus, then the target's
        for lang in langs:  # features on its first tokens
            stages += [_corpus_stage(plan, lang), _prefill_stage(plan, lang)]
    stages.append(_vocab_stage(plan))
    tracks = _train_tracks(plan)
    for track in tracks:
        stages.append(_pretrain_stage(plan, track))
        stages += [_finetune_stage(plan, track, lang) for lang in langs]
    stages.append(_export_stage(plan))
    stages.append(_engines_export_stage(plan, tracks[-1]))  # the last track's drafters: EAGLE-3
    if plan.on_policy:
        stages.append(_engines_score_stage(plan))
    if plan.profile.calibrate.enabled:
        stages.append(_calibrate_stage(plan))
    stages.append(_eval_stage(plan))
    stages.append(_report_stage(plan))
    return stages


def _resolve_paths(profile: Profile) -> Profile:
    """A copy of the profile with its repository paths resolved as the commands spell them
    (``repo_path``)."""
    profile = profile.model_copy(deep=True)
    for part in (profile.synth, profile.distill, profile.vocab, profile.corpus):
        part.config = repo_path(part.config)
    profile.vocab.sources = repo_sources(profile.vocab.sources)
    profile.train.recipe = repo_path(profile.train.recipe)
    if profile.train.engine is not None:
        profile.train.engine.recipe = repo_path(profile.train.engine.recipe)
    accelerate_args = profile.train.accelerate_args
    if "--config_file" in accelerate_args:
        at = accelerate_args.index("--config_file") + 1
        accelerate_args[at] = repo_path(accelerate_args[at])
    if profile.eval.questions:
        profile.eval.questions = repo_path(profile.eval.questions)
    return profile


def _store_stage(name: str, kind: str, cmd: list[str], out: Path, **fields) -> Stage:
    """A stage that writes the folder ``out``: its resumable work, its DONE record inside."""
    return Stage(name, kind, cmd, out / "DONE.json", work=[out], **fields)


def _synth_stage(plan: _PlanInputs, lang: str) -> Stage:
    """synth:<lang>: the target's self-synthesised instructions and answers in the language."""
    synth = plan.profile.synth
    overrides = [f"seed={plan.profile.seed}", *synth.overrides]
    out = plan.run / "synth" / lang
    return _store_stage(
        f"synth:{lang}",
        "synth",
        plan.command(
            "synth",
            "--config",
            synth.config,
            "--lang",
            lang,
            "--n",
            str(synth.n),
            *plan.target_run_args,
            *overrides,
        ),
        out,
        check=(
            SynthConfig,
            synth.config,
            [f"lang={lang}", f"n={synth.n}", f"target={plan.target}", *overrides],
        ),
    )


def _distill_stages(plan: _PlanInputs, lang: str) -> list[Stage]:
    """on-policy: distill:<lang> (the prompt pool at T = 0 and the sampled temperatures, features
    captured) and heldout:<lang> (the held-out prompts, greedy); continuation: distill:<lang>."""
    if not plan.on_policy:
        return [_continuation_stage(plan, lang)]
    distill = plan.profile.distill
    temperatures = ",".join(str(t) for t in distill.temperatures)
    limit = [f"limit={distill.limit}"] if distill.limit else []
    # the prompt files they read are hashed too: a changed held-out set or task file redoes them
    # (the pool leaves out every held-out and benchmark turn, so those files shape it as well)
    heldout = repo_path("synth/data/heldout.jsonl")
    tasks = repo_path(f"synth/data/tasks/{lang}.yaml")
    pool_files = [
        tasks,
        heldout,
        repo_path("synth/data/heldout-chat.jsonl"),
        repo_path("decoder/data/mini_multispecbench.jsonl"),
    ]
    return [
        _capturing_distill_stage(
            plan,
            lang,
            "distill",
            "pool",
            temperatures,
            limit,
            deps=[f"synth:{lang}"],
            files=pool_files,
        ),
        _capturing_distill_stage(
            plan, lang, "heldout", "heldout", "0", [], deps=[], files=[heldout]
        ),
    ]


def _capturing_distill_stage(
    plan: _PlanInputs,
    lang: str,
    out_name: str,
    prompts: str,
    temperatures: str,
    extra: list[str],
    deps: list[str],
    files: list[str],
) -> Stage:
    """<out_name>:<lang>: the target's answers to a prompt set, its hidden states captured."""
    distill = plan.profile.distill
    # the last layer (EAGLE-1) and the three EAGLE-3 reads: every profile trains engine drafters
    overrides = [
        "capture_features=true",
        "feature_layers=eagle3",
        *extra,
        f"seed={plan.profile.seed}",
        *distill.overrides,
    ]
    return _synth_distill_stage(
        plan,
        f"{out_name}:{lang}",
        lang,
        out_name,
        ["--prompts", prompts],
        temperatures,
        overrides,
        deps=deps,
        data=[f for f in files if Path(f).is_file()],
    )


def _continuation_stage(plan: _PlanInputs, lang: str) -> Stage:
    """distill:<lang> (distill.mode=continuation): free-text continuations of the seeds, for the
    pretrain."""
    distill = plan.profile.distill
    temperatures = ",".join(str(t) for t in distill.temperatures)
    overrides = [f"seed={plan.profile.seed}", *distill.overrides]
    return _synth_distill_stage(
        plan, f"distill:{lang}", lang, "pretrain", ["--continuation"], temperatures, overrides
    )


def _synth_distill_stage(
    plan: _PlanInputs,
    name: str,
    lang: str,
    out_name: str,
    source: list[str],
    temperatures: str,
    overrides: list[str],
    deps: list[str] | None = None,
    data: list[str] | None = None,
) -> Stage:
    """A ``python -m synth distill`` stage writing ``synth/<lang>-<out_name>``: ``source`` says
    what it answers (``--prompts <set>`` or ``--continuation``)."""
    distill = plan.profile.distill
    out = plan.run / "synth" / f"{lang}-{out_name}"
    return _store_stage(
        name,
        "distill",
        plan.command(
            "synth",
            "distill",
            "--config",
            distill.config,
            "--lang",
            lang,
            *source,
            "--out-name",
            out_name,
            "--temperatures",
            temperatures,
            *plan.target_run_args,
            *overrides,
        ),
        out,
        deps=deps or [],
        check=(
            DistillConfig,
            distill.config,
            [f"lang={lang}", f"target={plan.target}", *overrides],
        ),
        data=data or [],
    )


def _corpus_stage(plan: _PlanInputs, lang: str) -> Stage:
    """corpus:<lang>: general text in the language (python -m corpus)."""
    corpus = plan.profile.corpus
    out = plan.run / "corpus" / lang
    return _store_stage(
        f"corpus:{lang}",
        "corpus",
        plan.command(
            "corpus",
            "--config",
            corpus.config,
            "--langs",
            lang,
            *plan.target_run_args,
            *corpus.overrides,
        ),
        out,
        check=(
            CorpusConfig,
            corpus.config,
            [f"langs=[{lang}]", f"target={plan.target}", *corpus.overrides],
        ),
    )


def _prefill_stage(plan: _PlanInputs, lang: str) -> Stage:
    """prefill:<lang>: the target's features on the first corpus.tokens tokens of corpus:<lang>."""
    corpus = plan.profile.corpus
    out = plan.run / "corpus" / f"{lang}-prefill"
    return _store_stage(
        f"prefill:{lang}",
        "prefill",
        plan.command(
            "corpus",
            "prefill",
            "--lang",
            lang,
            *plan.target_run_args,
            "--max-tokens",
            str(corpus.tokens),
            "--seq-len",
            str(corpus.seq_len),
        ),
        out,
        deps=[f"corpus:{lang}"],
    )


def _vocab_stage(plan: _PlanInputs) -> Stage:
    """vocab: the draft vocabularies (one per mask size) over every language."""
    vocab, sizes = plan.profile.vocab, plan.profile.export.sizes
    # on-policy: the distilled answers are counted, the held-out ones measure coverage
    reads = ("synth", "distill", "heldout") if plan.on_policy else ("synth",)
    return Stage(
        "vocab",
        "vocab",
        plan.command(
            "vocab",
            "--config",
            vocab.config,
            "--langs",
            plan.langs_arg,
            "--sources",
            vocab.sources,
            *plan.target_run_args,
            f"mask_sizes=[{','.join(map(str, sizes))}]",
            *vocab.overrides,
        ),
        plan.run / "vocab" / "DONE.json",
        deps=[f"{kind}:{lang}" for lang in plan.langs for kind in reads],
        check=(
            VocabConfig,
            vocab.config,
            [f"mask_sizes={sizes}", f"sources={_sources(vocab.sources)}", *vocab.overrides],
        ),
    )


def _accelerate_args(train: TrainStage) -> list[str]:
    """The profile's ``accelerate launch`` arguments, with a CPU thread count where none is set."""
    args = train.accelerate_args
    if "--config_file" in args or "--num_cpu_threads_per_process" in args:
        return args
    # accelerate launch would otherwise set OMP_NUM_THREADS=1 for a CPU process: half the training
    # speed on 2 cores (measured)
    processes = int(args[args.index("--num_processes") + 1]) if "--num_processes" in args else 1
    threads = max(1, (os.cpu_count() or 1) // processes)
    return [*args, "--num_cpu_threads_per_process", str(threads)]


def _train_tracks(plan: _PlanInputs) -> list[_TrainTrack]:
    """The profile's own drafters (train:*), and the EAGLE-3 drafters engines load beside them
    (train3:*) where the own ones are of another form."""
    train = plan.profile.train
    launch = plan.command(
        "accelerate.commands.launch",
        *_accelerate_args(train),
        repo_path("train/drafter.py"),
        "--config",
    )
    tracks = [
        _TrainTrack(
            "train",
            "train",
            train.recipe,
            train.pretrain_overrides,
            train.finetune_overrides,
            [*launch, train.recipe],
        )
    ]
    if train.engine is not None:
        engine = train.engine
        tracks.append(
            _TrainTrack(
                "train3",
                engine.train_dir,
                engine.recipe,
                engine.pretrain_overrides,
                engine.finetune_overrides,
                [*launch, engine.recipe],
            )
        )
    return tracks


def _trainer_overrides(plan: _PlanInputs, track: _TrainTrack, lang: str, stage: str) -> list[str]:
    """The overrides every trainer run of a track starts with."""
    where = [f"train_dir={track.train_dir}"] if track.train_dir != "train" else []
    return [
        f"lang={lang}",
        f"target={plan.target}",
        f"run={plan.run_arg}",
        f"stage={stage}",
        f"seed={plan.profile.seed}",
        *where,
    ]


def _pretrain_stage(plan: _PlanInputs, track: _TrainTrack) -> Stage:
    """<prefix>:pretrain: one multilingual pretrain on every language's distilled data (and the
    prefilled corpus); an EAGLE-3 pretrain reads one draft vocabulary interleaving every
    language's."""
    run, first, corpus = plan.run_arg, plan.first_lang, plan.profile.corpus.enabled
    distilled = "distill" if plan.on_policy else "pretrain"
    data = [
        *(f"{run}/synth/{lang}-{distilled}/data.jsonl" for lang in plan.langs),
        *(f"{run}/corpus/{lang}-prefill/data.jsonl" for lang in plan.langs if corpus),
    ]
    captured = ["features=captured"] if plan.on_policy else []
    multilingual = (
        [f"eagle.vocab_langs=[{plan.langs_arg}]"]
        if is_eagle3(track.recipe, track.pretrain_overrides)
        else []
    )
    overrides = [
        *_trainer_overrides(plan, track, first, "pretrain"),
        f"data.pretrain=[{','.join(data)}]",
        *captured,
        *multilingual,
        *track.pretrain_overrides,
    ]
    out = plan.run / track.train_dir / first / "pretrain"
    return _store_stage(
        f"{track.prefix}:pretrain",
        "pretrain",
        [*track.launch, *overrides],
        out,
        deps=[
            "vocab",
            *(f"distill:{lang}" for lang in plan.langs),
            *(f"prefill:{lang}" for lang in plan.langs if corpus),
        ],
        check=(TrainConfig, track.recipe, overrides),
    )


def _finetune_stage(plan: _PlanInputs, track: _TrainTrack, lang: str) -> Stage:
    """<prefix>:<lang>: the language's finetune from the pretrain weights; on-policy, on its
    distilled answers, scored on its held-out ones."""
    run = plan.run_arg
    captured = ["features=captured"] if plan.on_policy else []
    data = (
        [
            f"data.finetune=[{run}/synth/{lang}-distill/data.jsonl]",
            f"data.eval_file=[{run}/synth/{lang}-heldout/data.jsonl]",
        ]
        if plan.on_policy
        else []
    )
    pretrained = f"{run}/{track.train_dir}/{plan.first_lang}/pretrain/final"
    overrides = [
        *_trainer_overrides(plan, track, lang, "finetune"),
        f"init_from={pretrained}",
        *captured,
        *data,
        *track.finetune_overrides,
    ]
    reads = [f"distill:{lang}", f"heldout:{lang}"] if plan.on_policy else [f"synth:{lang}"]
    out = plan.run / track.train_dir / lang
    return Stage(
        f"{track.prefix}:{lang}",
        "finetune",
        [*track.launch, *overrides],
        out / "DONE.json",
        work=[out / "finetune"],
        deps=[f"{track.prefix}:pretrain", *reads, "vocab"],
        check=(TrainConfig, track.recipe, overrides),
    )


def _export_stage(plan: _PlanInputs) -> Stage:
    """export: the bundle of the profile's own drafters and draft vocabularies."""
    export = plan.profile.export
    return Stage(
        "export",
        "export",
        plan.command(
            "export",
            *plan.export_args,
            "--out",
            str(plan.bundle),
            "--sizes",
            ",".join(map(str, export.sizes)),
            "--window",
            str(export.window),
            "--step",
            str(export.step),
            "--offset",
            str(export.offset),
        ),
        plan.run / "export" / "DONE.json",
        deps=[f"train:{lang}" for lang in plan.langs] + ["vocab"],
    )


def _engines_export_stage(plan: _PlanInputs, track: _TrainTrack) -> Stage:
    """export:engines: every profile ships drafters an engine loads: speculators folders (vLLM,
    SGLang) per language and for the multilingual pretrain, GGUFs where llama.cpp's converter is at
    hand, and engines.json saying which loads what."""
    return Stage(
        "export:engines",
        "export",
        plan.command(
            "export",
            "engines",
            *plan.export_args,
            "--train-dir",
            track.train_dir,
            "--out",
            str(plan.engines),
            "--sizes",
            ",".join(map(str, plan.profile.export.sizes)),
        ),
        plan.engines / "DONE.json",
        deps=[
            f"{track.prefix}:pretrain",
            *(f"{track.prefix}:{lang}" for lang in plan.langs),
            "vocab",
        ],
    )


def _engines_score_stage(plan: _PlanInputs) -> Stage:
    """score:engines (on-policy): each language's own engine drafter beside the multilingual one, on
    the same held-out answers."""
    return Stage(
        "score:engines",
        "export",
        plan.command(
            "pipelines.score_check",
            "--run",
            plan.run_arg,
            "--engines",
            str(plan.engines),
            "--target",
            plan.target,
            "--gamma",
            "4",
        ),
        plan.run / "export" / "engines-score" / "DONE.json",
        deps=["export:engines", *(f"heldout:{lang}" for lang in plan.langs)],
    )


def _calibrate_stage(plan: _PlanInputs) -> Stage:
    """calibrate: the bundle's draft-length calibration (decoder.calibrate)."""
    calibrate = plan.profile.calibrate
    return Stage(
        "calibrate",
        "calibrate",
        plan.command(
            "decoder.calibrate",
            "--bundle",
            str(plan.bundle),
            "--target",
            plan.target,
            "--sizes",
            ",".join(map(str, calibrate.sizes)),
            "--prompts",
            str(calibrate.prompts),
            "--max-new-tokens",
            str(calibrate.max_new_tokens),
        ),
        plan.run / "calibrate" / "DONE.json",
        deps=["export", "export:engines"],
    )


def _eval_stage(plan: _PlanInputs) -> Stage:
    """eval: the profile's decoding methods benchmarked (decoder.bench); unknown methods refused."""
    profile, evaluation = plan.profile, plan.profile.eval
    unknown = sorted(set(evaluation.methods) - set(METHODS))
    if unknown:
        raise PolyspecError(
            f"profile {profile.name}: unknown eval methods {unknown}; "
            f"choose from {', '.join(METHODS)}"
        )
    engine_bundle = str(plan.engines / "bundle")
    optional = [
        *(["--engine-bundle", engine_bundle] if "eagle3" in evaluation.methods else []),
        *(["--per-cell", str(evaluation.per_cell)] if evaluation.per_cell else []),
        *(["--questions", evaluation.questions] if evaluation.questions else []),
    ]
    after = ["calibrate"] if profile.calibrate.enabled else ["export", "export:engines"]
    return Stage(
        "eval",
        "eval",
        plan.command(
            "decoder.bench",
            "--bundle",
            str(plan.bundle),
            "--target",
            plan.target,
            "--langs",
            plan.langs_arg,
            "--methods",
            ",".join(evaluation.methods),
            "--max-new-tokens",
            str(evaluation.max_new_tokens),
            "--repeats",
            str(evaluation.repeats),
            "--out",
            str(plan.run / "eval"),
            *optional,
        ),
        plan.run / "eval" / "DONE.json",
        deps=after,
    )


def _report_stage(plan: _PlanInputs) -> Stage:
    """report: <run>/report/ from every stage's records (python -m pipelines report)."""
    scored = ["score:engines"] if plan.on_policy else []
    return Stage(
        "report",
        "report",
        plan.command("pipelines", "report", "--run", plan.run_arg),
        plan.run / "report" / "DONE.json",
        deps=["eval", *scored],
    )


def is_eagle3(recipe: str, overrides: list[str] | None = None) -> bool:
    """Whether a train recipe (+ overrides) makes EAGLE-3-form drafters: the form vLLM, SGLang and
    llama.cpp load."""
    return load_config(TrainConfig, recipe, overrides or []).drafter_kind is DrafterKind.EAGLE3


def engine_drafters(profile: Profile) -> str | None:
    """The recipe whose drafters engines load, or None when the profile would export none."""
    if profile.train.engine is not None:
        eng = profile.train.engine
        return eng.recipe if is_eagle3(repo_path(eng.recipe), eng.finetune_overrides) else None
    return (
        profile.train.recipe
        if is_eagle3(repo_path(profile.train.recipe), profile.train.finetune_overrides)
        else None
    )


def _sources(spec: str) -> str:
    # the vocab CLI's own parser: the same rules as the command
    return json.dumps(parse_sources(spec))


def validate_plan(
    stages: list[Stage], profile: Profile, target: str, langs: list[str]
) -> list[str]:
    """Everything a dry run can check without weights or GPUs; returns what was checked."""
    checked = [
        f"target {resolve_target(target).name} (registry entry)",
        f"languages {', '.join(lang.code for lang in parse_languages(','.join(langs)))}",
    ]
    recipe = engine_drafters(profile)
    if recipe is None:
        raise PolyspecError(
            f"profile {profile.name}: its export would hold no drafter an engine loads — the train "
            f"recipe makes no EAGLE-3 drafters and train.engine is not set"
        )
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
        ds = (
            (yaml.safe_load(Path(cfg).read_text()) or {})
            .get("deepspeed_config", {})
            .get("deepspeed_config_file")
        )
        if ds:
            if not Path(ds).is_file():
                raise PolyspecError(f"DeepSpeed config {ds} (from {cfg}) not found")
            checked.append(f"DeepSpeed config {ds}")
    return checked
