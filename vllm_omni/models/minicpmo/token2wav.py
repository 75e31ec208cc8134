"""MiniCPM-o 4.5's token2wav (Stage 2): codec codes -> 24 kHz speech in a reference voice
(docs/minicpmo.md, "Token2wav").

`Token2Wav` holds the networks and the prompt models of a checkpoint's `assets/token2wav/`
folder; `voice()` turns a reference waveform into a `Voice`, `stream()` gives a session's
streaming state (token2wav_stream.py) and `inference()` vocodes a whole code sequence in one
pass (the flow model over prompt + codes at once, then HiFT once), the reference the streamed
chunks are measured against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from vllm_omni.models.minicpmo.token2wav_networks import Token2WavNetworks, load_networks
from vllm_omni.models.minicpmo.token2wav_prompt import PromptEncoder
from vllm_omni.models.minicpmo.token2wav_stream import (
    SILENCE_CODE,
    TURN_PREFIX,
    Token2WavStream,
    Voice,
    clone_cache,
)

ASSETS_DIR = Path("assets") / "token2wav"
SAMPLE_RATE = 24000
N_TIMESTEPS = 10  # Euler steps of the flow-matching solver


class Token2Wav:
    def __init__(self, networks: Token2WavNetworks, prompts: PromptEncoder, n_timesteps: int = N_TIMESTEPS):
        self.networks, self.prompts, self.n_timesteps = networks, prompts, n_timesteps

    @classmethod
    def from_folder(cls, folder: str | Path, device: str | torch.device = "cpu", seed: int = 0,
                    n_timesteps: int = N_TIMESTEPS) -> Token2Wav:
        """From a token2wav assets folder; `seed` draws the flow decoder's noise."""
        networks = load_networks(folder, device, seed)
        return cls(networks, PromptEncoder(folder, networks.up_rate), n_timesteps)

    @classmethod
    def from_checkpoint(cls, model_path: str | Path, device: str | torch.device = "cpu", seed: int = 0,
                        n_timesteps: int = N_TIMESTEPS) -> Token2Wav:
        return cls.from_folder(Path(model_path) / ASSETS_DIR, device, seed, n_timesteps)

    @torch.inference_mode()
    def voice(self, waveform: np.ndarray, sample_rate: int) -> Voice:
        """The voice of a mono float32 reference waveform (16 or 24 kHz, or any other rate)."""
        device = self.networks.device
        prompt = self.prompts.encode(waveform, sample_rate)
        prompt = replace(prompt, codes=prompt.codes.to(device), mel=prompt.mel.to(device),
                         speaker=prompt.speaker.to(device))
        lookahead = self.networks.lookahead
        self.networks.ensure_scratch(prompt.mel.shape[1], self.n_timesteps)
        # The prompt's codes are followed by `lookahead` silence codes, so that every prompt
        # frame is computed and cached; the first chunk continues from there.
        silence = torch.full((1, lookahead), SILENCE_CODE, dtype=prompt.codes.dtype, device=device)
        cache = self.networks.flow.setup_cache(torch.cat([prompt.codes, silence], dim=1), prompt.mel,
                                               prompt.speaker, n_timesteps=self.n_timesteps)
        return Voice(prompt=prompt, flow_cache=clone_cache(cache))

    def stream(self, voice: Voice, seed: int = 0) -> Token2WavStream:
        """A session's streaming state in `voice`, its first turn started."""
        return Token2WavStream(self.networks, voice, seed=seed, n_timesteps=self.n_timesteps)

    @torch.inference_mode()
    def inference(self, voice: Voice, codes: Sequence[int], seed: int = 0, turn_prefix: bool = True) -> np.ndarray:
        """float32 samples of `codes` vocoded in one pass (480 per mel frame, 960 per code). With
        `turn_prefix`, the codes follow the 3 silence codes a streamed turn starts with."""
        device, prompt = self.networks.device, voice.prompt
        codes = [SILENCE_CODE] * TURN_PREFIX * turn_prefix + [int(code) for code in codes]
        tokens = torch.tensor([codes], dtype=torch.long, device=device)
        lengths = torch.tensor([tokens.shape[1]], dtype=torch.int32, device=device)
        prompt_lengths = torch.tensor([prompt.codes.shape[1]], dtype=torch.int32, device=device)
        mel_lengths = torch.tensor([prompt.mel.shape[1]], dtype=torch.int32, device=device)
        mel = self.networks.flow.inference(tokens, lengths, prompt.codes, prompt_lengths, prompt.mel, mel_lengths,
                                           prompt.speaker, n_timesteps=self.n_timesteps)
        speech, _ = self.networks.vocode(mel, torch.zeros(1, 1, 0, device=device), seed=seed)
        return speech[0].clamp(-1.0, 1.0).float().cpu().numpy()
