"""Token2wav's voice prompt: what the flow model is conditioned on, from a reference waveform
(docs/minicpmo.md, "Token2wav").

* prompt speech codes: the s3 speech tokenizer (`speech_tokenizer_v2_25hz.onnx`, 25 codes/s)
  on Whisper-style 128-bin log-mel features of the 16 kHz audio;
* speaker embedding: CAM++ (`campplus.onnx`, 192 values) on Kaldi-style 80-bin log filterbanks
  of the 16 kHz audio, mean-normalised over time;
* prompt mel: 80 bins of the 24 kHz audio at 50 frames/s (n_fft 1920, hop 480, up to 8 kHz,
  natural log), cut or edge-padded to two frames per prompt code.

Both ONNX models run in onnxruntime; their inputs are bound by position, as their names are
the exporter's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime
import torch
from transformers import WhisperFeatureExtractor
from transformers.audio_utils import mel_filter_bank, spectrogram, window_function

from vllm_omni.audio.pcm import MODEL_RATE, resample

SPEECH_TOKENIZER, SPEAKER_MODEL = "speech_tokenizer_v2_25hz.onnx", "campplus.onnx"
TOKENIZER_RATE, MEL_RATE = MODEL_RATE, 24000
WHISPER_BINS, WHISPER_FFT, WHISPER_HOP = 128, 400, 160
KALDI_BINS, KALDI_FRAME, KALDI_HOP, KALDI_FFT = 80, 400, 160, 512
PROMPT_BINS, PROMPT_FFT, PROMPT_HOP, PROMPT_FMAX = 80, 1920, 480, 8000


@dataclass(frozen=True)
class VoicePrompt:
    codes: torch.Tensor  # [1, T] long: the reference's speech codes
    mel: torch.Tensor  # [1, up_rate * T, 80]
    speaker: torch.Tensor  # [1, 192] CAM++ embedding


def whisper_log_mel(audio16: np.ndarray) -> np.ndarray:
    """[128, frames]: Whisper's log-mel (centred 400-sample Hann frames every 160 samples,
    log10 floored 8 below the maximum, scaled by (x + 4) / 4), the speech tokenizer's input."""
    filters = torch.from_numpy(WhisperFeatureExtractor(feature_size=WHISPER_BINS).mel_filters).float()
    stft = torch.stft(torch.from_numpy(audio16), WHISPER_FFT, WHISPER_HOP, window=torch.hann_window(WHISPER_FFT),
                      return_complex=True)
    power = stft[..., :-1].abs() ** 2
    log_spec = (filters.T @ power).clamp(min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).numpy()


def kaldi_fbank(audio16: np.ndarray) -> np.ndarray:
    """[frames, 80]: Kaldi's fbank with its defaults (25 ms povey frames every 10 ms, DC
    removed, pre-emphasis 0.97, power spectrum over 512 points, 20 Hz to Nyquist, natural log),
    no dither, then the mean over time subtracted."""
    filters = mel_filter_bank(num_frequency_bins=KALDI_FFT // 2 + 1, num_mel_filters=KALDI_BINS, min_frequency=20.0,
                              max_frequency=TOKENIZER_RATE / 2, sampling_rate=TOKENIZER_RATE, norm=None,
                              mel_scale="kaldi", triangularize_in_mel_space=True)
    features = spectrogram(audio16, window_function(KALDI_FRAME, "povey", periodic=False), frame_length=KALDI_FRAME,
                           hop_length=KALDI_HOP, fft_length=KALDI_FFT, power=2.0, center=False, preemphasis=0.97,
                           mel_filters=filters, log_mel="log", mel_floor=float(np.finfo(np.float32).eps),
                           remove_dc_offset=True).T
    return (features - features.mean(axis=0, keepdims=True)).astype(np.float32)


def prompt_mel(audio24: np.ndarray) -> torch.Tensor:
    """[frames, 80]: the flow model's mel (reflect-padded 1920-point Hann frames every 480
    samples, magnitude, slaney mel up to 8 kHz, natural log floored at 1e-5)."""
    filters = torch.from_numpy(mel_filter_bank(num_frequency_bins=PROMPT_FFT // 2 + 1, num_mel_filters=PROMPT_BINS,
                                               min_frequency=0.0, max_frequency=PROMPT_FMAX, sampling_rate=MEL_RATE,
                                               norm="slaney", mel_scale="slaney")).float()
    pad = (PROMPT_FFT - PROMPT_HOP) // 2
    padded = torch.nn.functional.pad(torch.from_numpy(audio24)[None, None], (pad, pad), mode="reflect")[0]
    stft = torch.stft(padded, PROMPT_FFT, PROMPT_HOP, window=torch.hann_window(PROMPT_FFT), center=False,
                      return_complex=True)
    magnitude = torch.sqrt(torch.view_as_real(stft).pow(2).sum(-1) + 1e-9)
    return (filters.T @ magnitude[0]).clamp(min=1e-5).log().T


def _session(path: Path) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


class PromptEncoder:
    """Runs the speech tokenizer and the speaker model of an assets folder."""

    def __init__(self, folder: str | Path, up_rate: int):
        folder = Path(folder)
        missing = [name for name in (SPEECH_TOKENIZER, SPEAKER_MODEL) if not (folder / name).is_file()]
        if missing:
            raise FileNotFoundError(f"token2wav assets missing in {folder}: {', '.join(missing)}")
        self.up_rate = up_rate
        self._tokenizer = _session(folder / SPEECH_TOKENIZER)
        self._speaker = _session(folder / SPEAKER_MODEL)

    def encode(self, waveform: np.ndarray, sample_rate: int) -> VoicePrompt:
        """The prompt of a mono float32 reference waveform at any rate (16 or 24 kHz usually)."""
        waveform = np.asarray(waveform, dtype=np.float32).reshape(-1)
        audio16 = resample(waveform, sample_rate, TOKENIZER_RATE)
        feats = whisper_log_mel(audio16)[None]
        names = [node.name for node in self._tokenizer.get_inputs()]
        codes = self._tokenizer.run(None, {names[0]: feats, names[1]: np.array([feats.shape[2]], dtype=np.int32)})[0]
        codes = torch.from_numpy(codes.reshape(1, -1).astype(np.int64))
        fbank = kaldi_fbank(audio16)[None]
        speaker = self._speaker.run(None, {self._speaker.get_inputs()[0].name: fbank})[0]
        mel = prompt_mel(resample(waveform, sample_rate, MEL_RATE))
        frames = codes.shape[1] * self.up_rate
        mel = torch.cat([mel, mel[-1:].expand(max(frames - mel.shape[0], 0), -1)])[:frames]
        return VoicePrompt(codes=codes, mel=mel[None].contiguous(), speaker=torch.from_numpy(speaker).reshape(1, -1))
