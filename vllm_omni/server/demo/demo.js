// The voice demo (docs/demo.md): talk to the server's model from a browser over /v1/realtime.
// Microphone → 24 kHz PCM16 appends; the streamed answer plays gap-free; speech that starts
// during an answer stops its playback at once and tells the server what was heard
// (conversation.item.truncate); playback.ack reports playback as it goes.

const WIRE_RATE = 24000;
const APPEND_MS = 100;
const $ = (id) => document.getElementById(id);

// What the page did, for people (the table) and for tests (window.demoStats).
const stats = { state: "not connected", receivedSamples: 0, playedSamples: 0, playedByResponse: {}, turns: [],
  bargeIns: 0, errors: [] };
window.demoStats = stats;

let socket = null;
let context = null;
let player = null;
let pending = []; // captured Float32 blocks not yet sent
let pendingSamples = 0;
let talking = false; // push to talk: the button is held
let turn = null; // the turn being answered: {index, endedAt, ttftMs, ttfpMs, responseId, itemId, received, ...}
let played = {}; // samples played, by response id (from the playback worklet)

function mode() {
  return document.querySelector('input[name="mode"]:checked').value;
}

function setState(text) {
  stats.state = text;
  $("state").textContent = text;
}

function showError(text) {
  stats.errors.push(text);
  $("error").textContent = text;
}

function send(event) {
  if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(event));
}

function line(role, text) {
  const item = document.createElement("li");
  item.className = role;
  item.textContent = text;
  $("transcript").append(item);
  scrollDown();
  return item;
}

function scrollDown() {
  const list = $("transcript");
  list.scrollTop = list.scrollHeight;
}

function toBase64Pcm16(blocks, total) {
  const pcm = new Int16Array(total);
  let at = 0;
  for (const block of blocks) {
    for (let i = 0; i < block.length; i++) pcm[at++] = Math.max(-32768, Math.min(32767, Math.round(block[i] * 32767)));
  }
  let binary = "";
  const bytes = new Uint8Array(pcm.buffer);
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

function fromBase64Pcm16(text) {
  const bytes = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const pcm = new Int16Array(bytes.buffer, 0, bytes.length >> 1);
  return Float32Array.from(pcm, (v) => v / 32768);
}

function captured(block) {
  if (mode() === "ptt" && !talking) return;
  pending.push(block);
  pendingSamples += block.length;
  if (pendingSamples >= (WIRE_RATE * APPEND_MS) / 1000) flushAudio();
}

function flushAudio() {
  if (!pendingSamples) return;
  send({ type: "input_audio_buffer.append", audio: toBase64Pcm16(pending, pendingSamples) });
  pending = [];
  pendingSamples = 0;
}

function sessionUpdate() {
  const vad = mode() === "vad" ? { type: "server_vad", create_response: true, interrupt_response: true } : null;
  return {
    type: "session.update",
    session: {
      type: "realtime",
      output_modalities: ["audio"],
      audio: {
        input: { format: { type: "audio/pcm", rate: WIRE_RATE }, turn_detection: vad, transcription: { model: "default" } },
        output: { format: { type: "audio/pcm", rate: WIRE_RATE } },
      },
    },
  };
}

// Turns and timings ----------------------------------------------------------------------

function turnEnded() {
  // the user's line goes up now and gets its transcript when the server has it
  turn = { index: stats.turns.length + 1, endedAt: performance.now(), ttftMs: null, ttfpMs: null, responseId: null,
    itemId: null, userItemId: null, receivedSamples: 0, ackedMs: 0, end: "answering", userLine: line("user", "…"),
    assistantLine: null };
  stats.turns.push(turn);
  renderTimings();
}

function userTranscript(event) {
  const owner = stats.turns.find((t) => t.userItemId === event.item_id);
  if (owner) owner.userLine.textContent = event.transcript || "(speech)";
  scrollDown();
}

function renderTimings() {
  const cell = (value, digits = 0) => (value === null || value === undefined ? "–" : value.toFixed(digits));
  $("timings").replaceChildren(...stats.turns.map((t) => {
    const row = document.createElement("tr");
    const playedSamples = t.responseId ? played[t.responseId] || 0 : 0;
    for (const value of [String(t.index), cell(t.ttftMs), cell(t.ttfpMs), cell(t.receivedSamples / WIRE_RATE, 1),
      cell(playedSamples / WIRE_RATE, 1), t.end]) {
      const td = document.createElement("td");
      td.textContent = value;
      row.append(td);
    }
    return row;
  }));
  $("received").textContent = (stats.receivedSamples / WIRE_RATE).toFixed(1);
  $("played").textContent = (stats.playedSamples / WIRE_RATE).toFixed(1);
}

function bargeIn() {
  // The user speaks over an answer (still being generated, or still playing): stop its
  // playback now and tell the server what was heard.
  if (!turn || !turn.responseId) return;
  const heard = played[turn.responseId] || 0;
  const playing = turn.receivedSamples - heard > WIRE_RATE / 10; // playback reports come every 100 ms
  if (turn.end !== "answering" && !playing) return; // that answer is over
  player.port.postMessage({ type: "clear" });
  // server VAD cancels the answer itself (interrupt_response); push to talk must ask
  if (mode() === "ptt" && turn.end === "answering") send({ type: "response.cancel" });
  stats.bargeIns += 1;
  turn.end = "barge-in";
  if (turn.itemId) {
    send({ type: "conversation.item.truncate", item_id: turn.itemId, content_index: 0,
      audio_end_ms: Math.floor((heard * 1000) / WIRE_RATE) });
  }
  renderTimings();
}

function acknowledgePlayback() {
  if (!turn || !turn.responseId) return;
  const playedMs = Math.floor(((played[turn.responseId] || 0) * 1000) / WIRE_RATE);
  if (playedMs === turn.ackedMs) return;
  turn.ackedMs = playedMs;
  send({ type: "playback.ack", response_id: turn.responseId, played_ms: playedMs });
}

// Server events ------------------------------------------------------------------------------

const handlers = {
  "session.created": () => setState("connected"),
  "session.updated": () => setState(mode() === "vad" ? "listening" : "ready: hold to talk"),
  "input_audio_buffer.speech_started": () => {
    bargeIn();
    setState("hearing you");
  },
  "input_audio_buffer.speech_stopped": () => turnEnded(),
  "input_audio_buffer.committed": (event) => {
    if (turn && !turn.userItemId) turn.userItemId = event.item_id;
  },
  "conversation.item.input_audio_transcription.completed": userTranscript,
  "response.created": (event) => {
    if (!turn || turn.responseId) turnEnded(); // an answer without a turn end seen here (push to talk commits)
    turn.responseId = event.response.id;
    turn.assistantLine = line("assistant", "");
    setState("answering");
  },
  "response.output_item.added": (event) => {
    if (turn && event.item.type === "message") turn.itemId = event.item.id;
  },
  "response.output_audio_transcript.delta": (event) => {
    if (!turn || turn.responseId !== event.response_id) return;
    if (turn.ttftMs === null) turn.ttftMs = performance.now() - turn.endedAt;
    turn.assistantLine.textContent += event.delta;
    scrollDown();
    renderTimings();
  },
  "response.output_audio.delta": (event) => {
    if (!turn || turn.responseId !== event.response_id || turn.end === "barge-in") return;
    if (turn.ttfpMs === null) turn.ttfpMs = performance.now() - turn.endedAt;
    const samples = fromBase64Pcm16(event.delta);
    turn.receivedSamples += samples.length;
    stats.receivedSamples += samples.length;
    player.port.postMessage({ type: "chunk", responseId: event.response_id, samples }, [samples.buffer]);
  },
  "response.done": (event) => {
    if (turn && turn.responseId === event.response.id && turn.end === "answering") turn.end = event.response.status;
    setState(mode() === "vad" ? "listening" : "ready: hold to talk");
    renderTimings();
  },
  error: (event) => {
    const error = event.error || event; // a route's refusal comes flat, before any session exists
    showError(`${error.code || error.type}: ${error.message}`);
  },
};

function onServerEvent(message) {
  const event = JSON.parse(message.data);
  const handler = handlers[event.type];
  if (handler) handler(event);
}

// Connecting -----------------------------------------------------------------------------------

async function startAudio() {
  // at the device's own rate (not every browser connects a microphone to a context at
  // another rate); the worklets resample to and from the wire's 24 kHz
  context = new AudioContext();
  await context.audioWorklet.addModule("/demo/audio-worklets.js");
  const echoCancellation = new URLSearchParams(location.search).get("echo_cancellation") !== "0";
  const micStream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation,
    noiseSuppression: echoCancellation, autoGainControl: echoCancellation } });
  const capture = new AudioWorkletNode(context, "capture-processor");
  capture.port.onmessage = (event) => captured(event.data);
  context.createMediaStreamSource(micStream).connect(capture);
  player = new AudioWorkletNode(context, "playback-processor", { outputChannelCount: [1] });
  player.port.onmessage = (event) => {
    played = event.data.played;
    stats.playedByResponse = played;
    stats.playedSamples = Object.values(played).reduce((a, b) => a + b, 0);
    acknowledgePlayback();
    renderTimings();
  };
  player.connect(context.destination);
  await context.resume();
}

async function connect() {
  $("error").textContent = "";
  setState("connecting");
  try {
    if (!player) await startAudio();
  } catch (error) {
    if (context) context.close();
    context = player = null;
    setState("not connected");
    showError(`microphone or audio: ${error.message}`);
    return;
  }
  const key = $("api-key").value.trim();
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const path = $("duplex").checked ? "/v1/duplex" : "/v1/realtime";
  socket = new WebSocket(`${scheme}://${location.host}${path}`, ["realtime", ...(key ? [`openai-insecure-api-key.${key}`] : [])]);
  socket.onopen = () => send(sessionUpdate()); // on the duplex lane this opens the session
  socket.onmessage = onServerEvent;
  socket.onclose = (event) => {
    player.port.postMessage({ type: "clear" });
    turn = null;
    pending = [];
    pendingSamples = 0;
    talking = false;
    setState(`closed (${event.code}${event.reason ? ": " + event.reason : ""})`);
    $("connect").textContent = "Start";
    $("talk").disabled = true;
    socket = null;
  };
  $("connect").textContent = "Stop";
  $("talk").disabled = mode() !== "ptt";
}

function disconnect() {
  if (socket) socket.close(1000, "client_close");
}

function holdTalk(down) {
  if (mode() !== "ptt" || !socket || talking === down) return;
  talking = down;
  $("talk").setAttribute("aria-pressed", String(down));
  if (down) {
    bargeIn();
    setState("hearing you");
  } else {
    flushAudio();
    send({ type: "input_audio_buffer.commit" });
    turnEnded();
    send({ type: "response.create" });
  }
}

$("connect").addEventListener("click", () => (socket ? disconnect() : connect()));
const talk = $("talk");
talk.addEventListener("pointerdown", () => holdTalk(true));
talk.addEventListener("pointerup", () => holdTalk(false));
talk.addEventListener("pointerleave", () => holdTalk(false));
talk.addEventListener("keydown", (event) => {
  if ((event.key === " " || event.key === "Enter") && !event.repeat) {
    event.preventDefault();
    holdTalk(true);
  }
});
talk.addEventListener("keyup", (event) => {
  if (event.key === " " || event.key === "Enter") holdTalk(false);
});
for (const radio of document.querySelectorAll('input[name="mode"]')) {
  radio.addEventListener("change", () => {
    $("talk").disabled = !socket || mode() !== "ptt";
    send(sessionUpdate());
  });
}
