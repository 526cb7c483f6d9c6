"""ADASPEC Alg. 1 lines 2–10 for languages that are not built in: the target translates the English
system prompt and few-shot seeds into language ℓ; the result is checked by language ID and cached at
``<cache>/languages/<target>/<code>.yaml`` (so vocab/train/decoder find it too)."""

from __future__ import annotations

import yaml

from polyspec.io import atomic_write_text
from polyspec.languages import Language, derived_metadata, get_language, translated_path
from polyspec.lid import identify
from polyspec.prompts import render
from synth.engines import Engine, Request

# P_trans of Alg. 1: an instruction to translate, followed by the text.
TRANSLATION_PROMPT = (
    "Translate the following text from English into {language}. "
    "Write only the {language} translation, nothing else.\n\n{text}"
)


def translate_language(
    code: str, target, engine: Engine, max_new_tokens: int = 256, log=print
) -> Language:
    """Translate the English registry entry into ``code`` with the target (greedy), cache and return
    it."""
    path = translated_path(code, target.spec.name)
    if path.is_file():
        return get_language(code, target=target.spec.name)
    meta = derived_metadata(code)
    en = get_language("en")
    texts = [en.system_prompt] + [t for s in en.seeds for t in (s.instruction, s.response)]
    fmt = target.spec.prompt_format

    def prompt(text: str) -> str:
        user = TRANSLATION_PROMPT.format(language=meta["name"], text=text)
        return render(fmt, target.tokenizer, [{"role": "user", "content": user}])

    # lines 3 and 5–9: P_sys^ℓ ← M(P_trans ⊕ P_sys^EN); (I^ℓ, R^ℓ) ← (M(P_trans ⊕ I), M(P_trans ⊕
    # R))
    reqs = [
        Request(
            prompt=prompt(t), seed=0, temperature=0.0, max_new_tokens=max_new_tokens, stop=fmt.stop
        )
        for t in texts
    ]
    out = [r.text.strip() or src for r, src in zip(engine.generate(reqs), texts)]
    lids = [identify(t) for t in out]
    ok = sum(1 for label, _ in lids if label == code)
    log(
        f"[synth] translated {len(out)} texts into {meta['name']} with {target.spec.name}: "
        f"{ok}/{len(out)} detected as {code} by fastText"
    )
    seeds = [
        {"task": s.task, "instruction": out[1 + 2 * i], "response": out[2 + 2 * i]}
        for i, s in enumerate(en.seeds)
    ]
    entry = {
        **meta,
        "system_prompt": out[0],
        "seeds": seeds,
        "translation": {
            "target": target.spec.name,
            "lid": [{"label": lab, "prob": round(p, 4)} for lab, p in lids],
        },
    }
    header = (
        f"# Translated by {target.spec.name} (ADASPEC Alg. 1 lines 2-10); used by: make "
        f"synth LANG={code}\n"
    )
    atomic_write_text(path, header + yaml.safe_dump(entry, allow_unicode=True, sort_keys=False))
    return get_language(code, target=target.spec.name)
