"""Images in user turns: the thinker sees them on both backends, as transformers does.

The torch backend equals transformers' `generate` on the tiny checkpoint at float32 (thinker
tokens, talker codes, audio) for prompts with images, and the vLLM stages equal the torch
backend.
Images count as tokens and change what the thinker computes; bytes that are no image, and
images a deploy does not allow, fail only their request with a clear error.
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from tests.conftest import read_fixture_pcm
from tests.engine_helpers import make_engine, run_request
from tests.hf_reference import cached_reference, hf_generate, hf_messages
from vllm_omni.audio.pcm import float_to_pcm16
from vllm_omni.config import SamplingParams, get_deploy_config_path, load_deploy_config
from vllm_omni.engine import Message, OmniRequest, RequestError
from vllm_omni.models.qwen3_omni.talker_bridge import ThinkerToTalkerBridge
from vllm_omni.models.qwen3_omni.torch_backend.thinker import TorchThinker
from vllm_omni.models.qwen3_omni.vllm_backend.thinker import VllmThinkerDriver

THINKER_TOKENS = 16
TALKER_TOKENS = 40


def picture(kind: str, size: tuple[int, int] = (96, 64), fmt: str = "PNG") -> bytes:
    """A small synthetic picture with shapes; `kind` picks which."""
    image = Image.new("RGB", size, (30, 60, 200) if kind == "sun" else (240, 240, 230))
    draw = ImageDraw.Draw(image)
    if kind == "sun":
        draw.ellipse((8, 8, 48, 48), fill=(255, 210, 0))
        draw.rectangle((0, 52, size[0], size[1]), fill=(20, 160, 40))
    else:
        draw.polygon([(48, 4), (90, 60), (6, 60)], fill=(200, 20, 20))
        draw.line((0, 0, size[0], size[1]), fill=(0, 0, 0), width=3)
    return encoded(image, fmt)


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


# (role, text, picture kinds, audio fixture) per turn.
CASES = {
    "image": [("user", "What is in this picture?", ["sun"], None)],
    "two_images": [("system", "You describe pictures.", [], None),
                   ("user", "What is this?", ["sun"], None),
                   ("assistant", "A sunny meadow.", [], None),
                   ("user", "And this one?", ["house"], None)],
    # transformers' talker fails on a prompt with images and audio (positions.py): thinker only
    "image_and_audio": [("user", "Describe both.", ["house"], "speech_en_single.wav")],
}
SPEAKS_AS_REFERENCE = ("image", "two_images")


def engine_request(case: str, **fields) -> OmniRequest:
    messages = [Message(role, text=text, images=[picture(kind) for kind in kinds],
                        audio=read_fixture_pcm(audio) if audio else None)
                for role, text, kinds, audio in CASES[case]]
    return OmniRequest(messages, speaker="Ethan", sampling={"thinker": {"max_tokens": THINKER_TOKENS},
                                                            "talker": {"max_tokens": TALKER_TOKENS}}, **fields)


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    """transformers' own processor and generate, on its own copy of the checkpoint; cached per case."""
    return cached_reference(tiny_checkpoint, reference_run)


def reference_run(model, processor, case: str) -> dict:
    turns = CASES[case]
    messages, audios = hf_messages([(role, text, len(kinds), audio) for role, text, kinds, audio in turns])
    images = [Image.open(io.BytesIO(picture(kind))) for _, _, kinds, _ in turns for kind in kinds]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=prompt, images=images, audio=audios or None, return_tensors="pt")
    speaks = case in SPEAKS_AS_REFERENCE
    sequences, waveform, codes = hf_generate(model, inputs, speaks=speaks, thinker_tokens=THINKER_TOKENS,
                                             talker_tokens=TALKER_TOKENS)
    result = {"prompt_ids": inputs["input_ids"][0].tolist(),
              "tokens": sequences[0, inputs["input_ids"].shape[1]:].tolist()}
    if speaks:
        result |= {"codes": codes.numpy(), "pcm": float_to_pcm16(waveform.reshape(-1).numpy()).astype(np.int32)}
    return result


@pytest.fixture(scope="module")
def engine(tiny_loaded):
    built = make_engine(tiny_loaded)
    yield built
    built.shutdown()


@pytest.mark.parametrize("case", list(CASES))
def test_torch_backend_equals_transformers(case: str, reference, engine) -> None:
    expected = reference(case)
    ours = asyncio.run(run_request(engine, engine_request(case)))
    final = ours["final"]
    assert final.finish_reason in ("stop", "length") and final.error is None
    assert engine.family.last_prompt.input_ids == expected["prompt_ids"]  # placeholders expanded alike
    assert list(final.token_ids) == expected["tokens"]
    assert np.abs(ours["pcm"]).max() > 100  # the talker speaks (conditioned on the image's rows)
    if case in SPEAKS_AS_REFERENCE:
        assert np.array_equal(ours["codes"], expected["codes"])
        assert ours["pcm"].shape == expected["pcm"].shape
        assert np.abs(ours["pcm"] - expected["pcm"]).max() <= 1


@pytest.mark.parametrize("case", list(CASES))
def test_vllm_stages_equal_the_torch_backend(case: str, reference, engine, vllm_engine) -> None:
    """Thinker tokens as transformers'; talker codes and audio as the torch backend's (which
    equal transformers' where its talker takes the prompt, see above)."""
    torch_result = asyncio.run(run_request(engine, engine_request(case)))
    ours = asyncio.run(run_request(vllm_engine, engine_request(case)))
    assert ours["final"].error is None, ours["final"].error
    assert list(ours["final"].token_ids) == reference(case)["tokens"]
    assert np.array_equal(ours["codes"], torch_result["codes"])
    assert ours["pcm"].shape == torch_result["pcm"].shape
    assert np.abs(ours["pcm"] - torch_result["pcm"]).max() <= 1


def test_an_image_costs_its_tokens_and_changes_what_the_thinker_computes(engine, tiny_loaded) -> None:
    family = engine.family
    question = [Message("user", text="What is this?")]
    plain = asyncio.run(run_request(engine, OmniRequest(question, modalities=("text",),
                                                        sampling={"thinker": {"max_tokens": 2}})))
    thinker = TorchThinker(tiny_loaded)
    prefills = {}
    for kind in ("sun", "house"):
        request = OmniRequest([Message("user", text="What is this?", images=[picture(kind)])],
                              modalities=("text",), sampling={"thinker": {"max_tokens": 2}})
        result = asyncio.run(run_request(engine, request))
        prompt = family.last_prompt
        (image,) = prompt.images
        assert image.num_tokens == 6  # 96x64 pixels: a 4x6 grid of 16-pixel patches, merged 2x2
        # the image's pads plus <|vision_start|> and <|vision_end|>
        assert result["final"].usage.prompt_tokens == plain["final"].usage.prompt_tokens + image.num_tokens + 2
        sequence = thinker.new_sequence(prompt, SamplingParams())
        prefills[kind] = thinker.prefill(sequence)
        # positions follow the 2x3 merged grid: the image spans 3 positions for its 6 tokens,
        # in the thinker's prompt and in the talker's
        assert sequence.rope_delta == -3
        assert ThinkerToTalkerBridge(tiny_loaded).prompt_positions(prompt)[1] == -3
    sun, house = prefills["sun"], prefills["house"]
    assert not torch.allclose(sun.embeddings, house.embeddings)  # the image rows hold the picture
    assert not torch.allclose(sun.accept_hidden[-1], house.accept_hidden[-1])  # and the answer attends to it


def test_an_image_and_its_position_in_the_turn_as_the_template_renders_it(engine) -> None:
    request = OmniRequest([Message("user", text="Look.", images=[picture("sun"), picture("house", fmt="JPEG")],
                                   audio=read_fixture_pcm("speech_en_single.wav")[:16000])],
                          modalities=("text",), sampling={"thinker": {"max_tokens": 2}})
    asyncio.run(run_request(engine, request))
    messages, audio_items = engine.family.last_render
    assert [p["type"] for p in messages[0]["content"]] == ["image", "image", "audio", "text"]
    assert audio_items == 1 and engine.family.last_image_count == 2


BAD_IMAGES = {
    "text": (b"this is not an image", "messages[0].images[0]: not a PNG or JPEG image"),
    "gif": (lambda: picture("sun", fmt="GIF"), "messages[0].images[0]: not a PNG or JPEG image"),
    "truncated jpeg": (lambda: picture("sun", fmt="JPEG")[:300], "messages[0].images[0]: the image cannot be decoded"),
    "not bytes": ("a path.png", "messages[0].images[0]: expected JPEG or PNG bytes, got str"),
    "too thin": (lambda: encoded(Image.new("RGB", (600, 2))), "messages[0].images[0]: the image processor refuses"),
}


@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_a_bad_image_fails_only_its_request(engine, case: str) -> None:
    data, message = BAD_IMAGES[case]
    bad = OmniRequest([Message("user", text="What is this?", images=[data() if callable(data) else data])])

    async def scenario():
        with pytest.raises(RequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
            async for _ in engine.generate(bad):
                pass
        good = await run_request(engine, engine_request("image"))
        assert good["final"].finish_reason in ("stop", "length")

    asyncio.run(scenario())


def test_only_user_turns_carry_images(engine) -> None:
    request = OmniRequest([Message("assistant", text="Here.", images=[picture("sun")]), Message("user", text="Hm?")])
    with pytest.raises(RequestError, match=r"messages\[0\]: only user turns may carry images"):
        asyncio.run(run_request(engine, request))


def test_a_deploy_without_images_refuses_them(tiny_loaded) -> None:
    """limit_mm_per_prompt image: 0 (checked before any stage sees the request, on either backend)."""
    blind = make_engine(tiny_loaded, image_limit=0)
    try:
        with pytest.raises(RequestError, match="limit_mm_per_prompt allows 0 image items"):
            asyncio.run(run_request(blind, engine_request("image")))
        earlier = [Message("user", text="See?", images=[picture("sun")]), Message("assistant", text="Yes."),
                   Message("user", text="Good.")]
        text_only = asyncio.run(run_request(blind, OmniRequest(earlier, modalities=("text",),
                                                               sampling={"thinker": {"max_tokens": 4}})))
        assert text_only["final"].finish_reason in ("stop", "length")
        rendered, _ = blind.family.last_render
        assert blind.family.last_image_count == 0
        assert rendered[0]["content"] == [{"type": "text", "text": "See?"}]  # the turn keeps its text
    finally:
        blind.shutdown()


def test_the_oldest_images_go_first(tiny_loaded) -> None:
    narrow = make_engine(tiny_loaded, image_limit=1)
    try:
        messages = [Message("user", images=[picture("sun")]), Message("assistant", text="A sun."),
                    Message("user", text="Now this.", images=[picture("house")])]
        result = asyncio.run(run_request(narrow, OmniRequest(messages, modalities=("text",),
                                                             sampling={"thinker": {"max_tokens": 4}})))
        assert result["final"].finish_reason in ("stop", "length")
        rendered, _ = narrow.family.last_render
        assert [m["role"] for m in rendered] == ["assistant", "user"]  # the image-only turn is gone
        assert narrow.family.last_image_count == 1
    finally:
        narrow.shutdown()


@pytest.mark.parametrize("image_limit", [0, 4])
def test_the_vllm_thinker_gets_the_deploys_image_limit(tiny_loaded, image_limit: int) -> None:
    stage = load_deploy_config(get_deploy_config_path("qwen3_omni_tiny_cpu"), platform="cpu").stage_by_role("thinker")
    stage = stage.model_copy(update={"engine_args": stage.engine_args.model_copy(
        update={"limit_mm_per_prompt": {"audio": 16, "image": image_limit}})})
    assert VllmThinkerDriver(tiny_loaded, stage).engine_kwargs()["limit_mm_per_prompt"]["image"] == image_limit
