// Audio worklets of the voice demo (docs/demo.md): microphone capture and gap-free playback,
// both at the realtime API's 24 kHz PCM rate, resampling linearly when the audio context
// runs at another rate; and a meter of what a WebRTC call's track delivers.

const WIRE_RATE = 24000;

// Resamples a stream linearly from one rate to another, chunk by chunk, without seams.
class LinearResampler {
  constructor(from, to) {
    this.step = from / to;
    this.position = 0; // of the next output sample, in input samples since `last`
    this.last = 0; // the input sample before the current chunk
  }

  process(input) {
    if (this.step === 1) return input;
    const out = [];
    while (this.position < input.length) {
      const index = Math.floor(this.position);
      const left = index === 0 ? this.last : input[index - 1];
      const right = input[index];
      const fraction = this.position - index;
      out.push(left + (right - left) * fraction);
      this.position += this.step;
    }
    this.position -= input.length;
    this.last = input[input.length - 1];
    return Float32Array.from(out);
  }
}

// Microphone samples to the page, at 24 kHz, in 128-frame render quanta.
class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.resampler = new LinearResampler(sampleRate, WIRE_RATE);
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel && channel.length) this.port.postMessage(this.resampler.process(channel));
    return true;
  }
}

// Plays queued 24 kHz chunks back to back; counts what was actually played per response.
// Messages in: {type: "chunk", responseId, samples} and {type: "clear"}. Out, every ~100 ms
// and at once after a clear: {played: {responseId: samples}}, counted at the wire rate.
class PlaybackProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.queue = []; // [{responseId, samples, offset}]
    this.played = {};
    this.resampler = new LinearResampler(WIRE_RATE, sampleRate);
    this.sinceReport = 0;
    this.port.onmessage = (event) => {
      const message = event.data;
      if (message.type === "chunk") {
        const samples = this.resampler.process(message.samples);
        this.queue.push({ responseId: message.responseId, samples, offset: 0, ratio: message.samples.length / samples.length });
      } else if (message.type === "clear") {
        this.queue = [];
        this.report();
      }
    };
  }

  report() {
    this.port.postMessage({ played: { ...this.played } });
    this.sinceReport = 0;
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    let written = 0;
    while (written < out.length && this.queue.length) {
      const chunk = this.queue[0];
      const take = Math.min(out.length - written, chunk.samples.length - chunk.offset);
      out.set(chunk.samples.subarray(chunk.offset, chunk.offset + take), written);
      chunk.offset += take;
      written += take;
      // played samples are counted at the wire rate, as the server counts its audio
      this.played[chunk.responseId] = (this.played[chunk.responseId] || 0) + take * chunk.ratio;
      if (chunk.offset === chunk.samples.length) this.queue.shift();
    }
    out.fill(0, written);
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    this.sinceReport += out.length;
    if (this.sinceReport >= sampleRate / 10) this.report();
    return true;
  }
}

// Counts what arrives on a received track (the WebRTC call's answer): every 20 ms,
// {samples, loud}: the samples at the wire rate, and whether any was louder than silence.
class MeterProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.samples = 0;
    this.loud = false;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) {
      this.samples += channel.length;
      this.loud = this.loud || channel.some((v) => Math.abs(v) > 1e-3);
    }
    if (this.samples >= sampleRate / 50) {
      this.port.postMessage({ samples: (this.samples * WIRE_RATE) / sampleRate, loud: this.loud });
      this.samples = 0;
      this.loud = false;
    }
    return true;
  }
}

registerProcessor("capture-processor", CaptureProcessor);
registerProcessor("meter-processor", MeterProcessor);
registerProcessor("playback-processor", PlaybackProcessor);
