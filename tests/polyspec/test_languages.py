import pytest

from polyspec.errors import PolyspecError
from polyspec.languages import Language, builtin_codes, get_language, parse_languages
from polyspec.lid import identify

BUILTIN = ["de", "en", "es", "fr", "ja", "vi", "zh"]


def test_the_seven_multispecbench_languages_are_built_in():
    assert builtin_codes() == BUILTIN


@pytest.mark.parametrize("code", BUILTIN)
def test_language_file_is_complete(code):
    lang = get_language(code)
    for field, info in Language.model_fields.items():
        if not info.is_required() and info.default is None:
            # optional metadata (e.g. `translation`, set only for target-translated entries)
            continue
        value = getattr(lang, field)
        assert value not in (None, "", []), f"{code}: {field} is empty"
    assert lang.code == code and lang.lid_code == code
    assert lang.fasttext_label == f"__label__{code}"
    assert lang.wikipedia.config == f"20231101.{code}"
    assert len(lang.seeds) >= 5
    # varied tasks, as ADASPEC's few-shot prompt needs: QA, math, code, summarization, translation,
    # advice
    assert {"qa", "math", "code", "summarization", "translation", "advice"} <= {
        s.task for s in lang.seeds
    }
    assert len({s.instruction for s in lang.seeds}) == len(lang.seeds)


@pytest.mark.parametrize("code", BUILTIN)
def test_seeds_and_system_prompt_are_detected_as_the_language(code):
    lang = get_language(code)
    label, prob = identify(lang.system_prompt)
    assert label == code, f"system prompt detected as {label}"
    for seed in lang.seeds:
        label, prob = identify(seed.instruction + "\n" + seed.response)
        assert label == code and prob >= lang.lid_threshold, (
            f"{code}/{seed.task}: {label} {prob:.2f}"
        )


def test_lid_detects_other_languages_too():
    assert identify("Das ist ein ganz normaler deutscher Satz über das Wetter.")[0] == "de"
    assert identify("これは日本語の文です。")[0] == "ja"
    assert identify("") == ("", 0.0)


def test_unknown_code_is_one_line_error_listing_supported():
    with pytest.raises(PolyspecError) as e:
        get_language("xx")
    msg = str(e.value)
    assert "\n" not in msg and "'xx'" in msg
    for code in BUILTIN:
        assert code in msg


def test_parse_languages():
    assert [lang.code for lang in parse_languages("vi, de,ja")] == ["vi", "de", "ja"]
    assert [lang.code for lang in parse_languages(["en"])] == ["en"]
    with pytest.raises(PolyspecError, match="duplicates"):
        parse_languages("vi,vi")
    with pytest.raises(PolyspecError, match="no language"):
        parse_languages(" , ")
