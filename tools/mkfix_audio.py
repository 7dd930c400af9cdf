#!/usr/bin/env python3
"""Writes the audio test fixtures (tests/fixtures/audio/) and the reference's features for them.

Runs in a venv holding the reference, `pip install qwen-asr==0.0.6` (it pins transformers
4.57.6 and brings torch, librosa, soundfile, soxr):

    ~/.cache/anna/venvs/asr/bin/python tools/mkfix_audio.py tests/fixtures/audio

For every clip it writes the encoded file (generated here: deterministic synthetic signals),
then runs the reference exactly as Qwen3-ASR does on a file path:
    wav = qwen_asr.inference.utils.normalize_audio_input(path)
          (librosa.load(sr=None, mono=False) -> channel mean -> librosa.resample soxr_hq to
           16 kHz -> divide by the peak if > 1, clip)
    feats = WhisperFeatureExtractor(feature_size=128)(wav, sampling_rate=16000, padding=True,
            truncation=False, return_attention_mask=True, return_tensors="pt")
            (the audio_kwargs Qwen3ASRProcessor.__call__ passes)
and stores feats as NAME.mel.f32 (float32 little-endian, [128][L] mel-major). For some clips
it also stores wav as NAME.wav16k.f32 so decode+resample and the mel can be checked apart, and
for two of those NAME.mel64.f32: the extractor's torch steps run in float64 (fbank_f64), the
exact value of the formula the float32 reference approximates.
`--front-only` regenerates only front/ (the encoder's conv front on a shrunk random config, run
on the stored reference features; see front_fixtures). expected.json lists, per clip: file, format, source rate/channels, n (16 kHz samples),
frames L, whether samples are stored, and versions of the reference packages.
"""
import json
import os
import sys

import numpy as np
import soundfile as sf

# Clips that also get NAME.mel64.f32: the extractor's formula in float64 on the stored samples.
F64_CASES = ("sweep_8k_mono", "bursts_48k_stereo")


def sweep(sr, seconds, f0, f1, amp):
    t = np.arange(int(round(sr * seconds))) / sr
    k = np.log(f1 / f0) / seconds
    return amp * np.sin(2 * np.pi * f0 * (np.exp(k * t) - 1) / k)


def bursts(sr, seconds, amp, seed_shift=0):
    """Speech-like: noise shaped by a few formant-ish resonances, in 80-250 ms syllables."""
    rng = np.random.default_rng(100 + seed_shift)
    n = int(round(sr * seconds))
    y = np.zeros(n)
    pos = int(0.05 * sr)
    while pos < n:
        dur = int(rng.uniform(0.08, 0.25) * sr)
        gap = int(rng.uniform(0.03, 0.12) * sr)
        seg = rng.standard_normal(dur)
        # two-pole resonators at random formants, then a voiced buzz under them
        out = np.zeros(dur)
        for fc in rng.uniform([300, 900, 2200], [800, 1800, 3200]):
            if fc >= sr / 2:
                continue
            r = 0.97
            a1, a2 = -2 * r * np.cos(2 * np.pi * fc / sr), r * r
            z1 = z2 = 0.0
            for i in range(dur):
                v = seg[i] - a1 * z1 - a2 * z2
                z2, z1 = z1, v
                out[i] += v
        f0 = rng.uniform(90, 220)
        out += 3 * np.sign(np.sin(2 * np.pi * f0 * np.arange(dur) / sr))
        env = np.sin(np.pi * np.arange(dur) / dur) ** 2
        seg = out * env
        end = min(n, pos + dur)
        y[pos:end] += seg[: end - pos]
        pos += dur + gap
    return amp * y / np.max(np.abs(y))


def fbank_f64(fe, wav):
    """WhisperFeatureExtractor._torch_extract_fbank_features, line for line, in float64 (the
    reference runs it in float32 with MKL's FFT; this is its formula evaluated exactly, to check
    the C mel tightly)."""
    import torch
    waveform = torch.from_numpy(wav.astype(np.float32)).to(torch.float64)
    window = torch.hann_window(fe.n_fft, dtype=torch.float32).to(torch.float64)
    stft = torch.stft(waveform, fe.n_fft, fe.hop_length, window=window, return_complex=True)
    magnitudes = stft[..., :-1].abs() ** 2
    mel_filters = torch.from_numpy(fe.mel_filters).to(torch.float32).to(torch.float64)
    mel_spec = mel_filters.T @ magnitudes
    log_spec = torch.clamp(mel_spec, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).numpy()


def clips():
    """(name, filename, sf.write kwargs, signal [T] or [T, C], rate, store 16 kHz samples)."""
    out = []
    # 8 kHz mono sweep, odd length (not a multiple of the hop after resampling)
    out.append(("sweep_8k_mono", "sweep_8k_mono.wav", dict(format="WAV", subtype="PCM_16"),
                sweep(8000, 2.0, 60, 3900, 0.8)[:15999], 8000, True))
    # 48 kHz stereo FLAC: different bursts per channel (the mean is what counts)
    st = np.stack([bursts(48000, 1.2, 0.7, 1), 0.5 * sweep(48000, 1.2, 200, 12000, 0.9)], 1)
    out.append(("bursts_48k_stereo", "bursts_48k_stereo.flac", dict(format="FLAC", subtype="PCM_16"),
                st, 48000, True))
    # 16 kHz silence (all-zero features path; no resampling, no peak division)
    out.append(("silence_16k", "silence_16k.wav", dict(format="WAV", subtype="PCM_16"),
                np.zeros(16000), 16000, False))
    # 16 kHz speech-like bursts, the model's own rate
    out.append(("bursts_16k", "bursts_16k.wav", dict(format="WAV", subtype="PCM_16"),
                bursts(16000, 2.0, 0.9, 2), 16000, False))
    # 22.05 kHz float WAV with a peak of 1.7: a non-integer ratio and the peak division
    out.append(("loud_22k_float", "loud_22k_float.wav", dict(format="WAV", subtype="FLOAT"),
                1.7 * bursts(22050, 1.0, 1.0, 3), 22050, True))
    # OGG Opus (libopus decodes at 48 kHz), mono bursts + sweep
    sig = 0.6 * bursts(48000, 1.5, 1.0, 4) + 0.3 * sweep(48000, 1.5, 100, 6000, 1.0)
    out.append(("mix_48k_opus", "mix_48k.opus", dict(format="OGG", subtype="OPUS"),
                sig, 48000, True))
    # MP3 44.1 kHz stereo
    st = np.stack([bursts(44100, 1.5, 0.8, 5), bursts(44100, 1.5, 0.6, 6)], 1)
    out.append(("bursts_44k_mp3", "bursts_44k.mp3", dict(format="MP3", subtype="MPEG_LAYER_III"),
                st, 44100, True))
    return out


# The encoder's conv front on a shrunk random config (released: hidden 480, d 896/1024).
FRONT = dict(num_mel_bins=128, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
             d_model=32, n_window=50, n_window_infer=800, downsample_hidden_size=16,
             output_dim=32, max_source_positions=1500)
# (case name, mel file, frames kept): a tail of 99, whole chunks, a 50 tail, one short chunk.
FRONT_CASES = (("sweep199", "sweep_8k_mono", None), ("bursts200", "bursts_16k", None),
               ("mp3_150", "bursts_44k_mp3", None), ("short60", "bursts_16k", 60),
               ("tiny7", "sweep_8k_mono", 7))
FRONT_TENSORS = ("conv2d1.weight", "conv2d1.bias", "conv2d2.weight", "conv2d2.bias",
                 "conv2d3.weight", "conv2d3.bias", "conv_out.weight")


def front_fixtures(dst):
    """Qwen3ASRAudioEncoder with random weights; its hidden states entering layer 0 (after the
    chunked convs, conv_out and the sinusoids) for reference mel inputs."""
    import torch
    from qwen_asr.core.transformers_backend.configuration_qwen3_asr import Qwen3ASRAudioEncoderConfig
    from qwen_asr.core.transformers_backend.modeling_qwen3_asr import Qwen3ASRAudioEncoder

    cfg = Qwen3ASRAudioEncoderConfig(**FRONT)
    cfg._attn_implementation = "eager"
    enc = Qwen3ASRAudioEncoder(cfg).eval()
    g = torch.Generator().manual_seed(2525)
    sd = enc.state_dict()
    with torch.no_grad():
        for name in FRONT_TENSORS:
            t = sd[name]
            fan_in = t[0].numel() if t.dim() > 1 else 10
            t.copy_(torch.randn(t.shape, generator=g) / np.sqrt(fan_in))
    fdir = os.path.join(dst, "front")
    os.makedirs(fdir, exist_ok=True)
    np.concatenate([sd[n].numpy().ravel() for n in FRONT_TENSORS]).astype("<f4").tofile(
        os.path.join(fdir, "weights.f32"))
    captured = {}
    enc.layers[0].register_forward_pre_hook(lambda mod, args: captured.__setitem__("h", args[0]))
    cases = []
    for name, src, keep in FRONT_CASES:
        mel = np.fromfile(os.path.join(dst, src + ".mel.f32"), dtype="<f4").reshape(128, -1)
        if keep:
            mel = np.ascontiguousarray(mel[:, :keep])
        L = mel.shape[1]
        with torch.no_grad():
            enc(torch.from_numpy(mel), feature_lens=torch.tensor([L]))
        h = captured["h"].numpy().astype("<f4")
        h.tofile(os.path.join(fdir, name + ".out.f32"))
        cases.append(dict(name=name, mel=src + ".mel.f32", frames=L, tokens=int(h.shape[0])))
        print(f"front {name}: L={L} -> {h.shape}")
    meta = dict(config=FRONT, tensors=[dict(name=n, shape=list(sd[n].shape)) for n in FRONT_TENSORS],
                weights="weights.f32 (the tensors in this order, float32 little-endian)",
                cases=cases)
    with open(os.path.join(fdir, "front.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


def main():
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] != "--front-only"):
        sys.exit(__doc__)
    dst = sys.argv[1]
    os.makedirs(dst, exist_ok=True)
    if len(sys.argv) == 3:
        front_fixtures(dst)
        return
    import librosa
    import soxr
    import torch
    import transformers
    import qwen_asr
    from qwen_asr.inference.utils import normalize_audio_input
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=128)
    cases = []
    for name, fname, kw, sig, rate, keep in clips():
        path = os.path.join(dst, fname)
        sf.write(path, sig.astype(np.float32), rate, **kw)
        wav = normalize_audio_input(path)
        feats = fe([wav], sampling_rate=16000, padding=True, truncation=False,
                   return_attention_mask=True, return_tensors="pt")["input_features"][0]
        feats = feats.numpy().astype("<f4")
        assert feats.shape == (128, wav.shape[0] // 160), feats.shape
        feats.tofile(os.path.join(dst, name + ".mel.f32"))
        if keep:
            wav.astype("<f4").tofile(os.path.join(dst, name + ".wav16k.f32"))
        f64 = name in F64_CASES
        if f64:
            ex = fbank_f64(fe, wav)
            assert np.max(np.abs(ex - feats)) < 1e-4, np.max(np.abs(ex - feats))
            ex.astype("<f4").tofile(os.path.join(dst, name + ".mel64.f32"))
        info = sf.info(path)
        cases.append(dict(name=name, file=fname, format=info.format, subtype=info.subtype,
                          src_rate=int(info.samplerate), src_channels=int(info.channels),
                          src_frames=int(info.frames), n=int(wav.shape[0]),
                          frames=int(feats.shape[1]), peak=float(np.max(np.abs(wav))),
                          samples_stored=bool(keep), mel64_stored=f64))
        print(f"{fname}: {os.path.getsize(path)} bytes, n={wav.shape[0]} L={feats.shape[1]}")
    meta = dict(
        reference=dict(qwen_asr=qwen_asr.__version__ if hasattr(qwen_asr, "__version__") else "0.0.6",
                       transformers=transformers.__version__, torch=torch.__version__,
                       librosa=librosa.__version__, soundfile=sf.__version__,
                       libsndfile=sf.__libsndfile_version__, soxr=soxr.__version__,
                       libsoxr=soxr.__libsoxr_version__ if hasattr(soxr, "__libsoxr_version__") else ""),
        feature_extractor=dict(feature_size=fe.feature_size, n_fft=fe.n_fft, hop_length=fe.hop_length,
                               sampling_rate=fe.sampling_rate, dither=fe.dither),
        cases=cases)
    with open(os.path.join(dst, "expected.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    front_fixtures(dst)


if __name__ == "__main__":
    main()
