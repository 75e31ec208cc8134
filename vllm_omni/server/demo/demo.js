// The voice demo (docs/demo.md): talk to the server's model from a browser.
// Over WebRTC (the default): the microphone goes out as an Opus track with the browser's echo
// cancellation, the answer comes back on the call's track, and the events travel on the
// `oai-events` data channel; the server stops the answer's playback when the user speaks over it.
// Over a WebSocket (the fallback, and the duplex lane): microphone → 24 kHz PCM16 appends; the
// streamed answer plays gap-free; speech that starts during an answer stops its playback at once
// and tells the server what was heard (conversation.item.truncate); playback.ack reports playback.

const WIRE_RATE = 24000;
const APPEND_MS = 100;
const $ = (id) => document.getElementById(id);

// What the page did, for people (the table) and for tests (window.demoStats).
const stats = { state: "not connected", receivedSamples: 0, playedSamples: 0, playedByResponse: {}, turns: [],
  bargeIns: 0, errors: [], transport: null };
window.demoStats = stats;

let link = null; // the open connection: {kind: "webrtc" | "websocket", open(), send(text), close()}
let context = null;
let player = null; // WebSocket playback worklet
let micStream = null;
let speaking = null; // WebRTC: the response whose audio the call's track is playing
let renderedAt = 0; // WebRTC: when the timings table was last drawn from the meter's reports
let pending = []; // captured Float32 blocks not yet sent
let pendingSamples = 0;
let talking = false; // push to talk: the button is held
let turn = null; // the turn being answered: {index, endedAt, ttftMs, ttfpMs, responseId, itemId, received, ...}
let played = {}; // samples played, by response id (from the playback worklet)

function mode() {
  return document.querySelector('input[name="mode"]:checked').value;
}

function transport() {
  const chosen = document.querySelector('input[name="transport"]:checked').value;
  // the duplex lane is a WebSocket route; a browser without WebRTC falls back too
  return chosen === "webrtc" && !$("duplex").checked && typeof RTCPeerConnection !== "undefined" ? "webrtc" : "websocket";
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
  if (link && link.open()) link.send(JSON.stringify(event));
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
  if (!link || link.kind !== "websocket" || (mode() === "ptt" && !talking)) return;
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
    itemId: null, userItemId: null, receivedSamples: 0, ackedMs: 0, truncatedMs: null, end: "answering",
    userLine: line("user", "…"),
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
  // The user speaks over an answer (still being generated, or still playing): its playback
  // stops now and the server learns what was heard.
  if (!turn || !turn.responseId) return;
  const rtc = link && link.kind === "webrtc";
  const heard = played[turn.responseId] || 0;
  // playback reports come every 100 ms over a WebSocket; over WebRTC the server says what plays
  const playing = rtc ? speaking === turn.responseId : turn.receivedSamples - heard > WIRE_RATE / 10;
  const answering = turn.end === "answering";
  if (!answering && !playing) return; // that answer is over
  stats.bargeIns += 1;
  turn.end = "barge-in";
  renderTimings();
  if (rtc && mode() === "vad") return; // the server cuts its track and truncates the item itself
  if (rtc) {
    send({ type: "output_audio_buffer.clear" }); // also cancels the answer if it is still generating
  } else {
    player.port.postMessage({ type: "clear" });
    // server VAD cancels the answer itself (interrupt_response); push to talk must ask
    if (mode() === "ptt" && answering) send({ type: "response.cancel" });
  }
  if (turn.itemId) {
    send({ type: "conversation.item.truncate", item_id: turn.itemId, content_index: 0,
      audio_end_ms: Math.floor((heard * 1000) / WIRE_RATE) });
  }
}

function acknowledgePlayback() {
  if (!turn || !turn.responseId || !link || link.kind !== "websocket") return;
  const playedMs = Math.floor(((played[turn.responseId] || 0) * 1000) / WIRE_RATE);
  if (playedMs === turn.ackedMs) return;
  turn.ackedMs = playedMs;
  send({ type: "playback.ack", response_id: turn.responseId, played_ms: playedMs });
}

function heardOnTrack(report) {
  // WebRTC: the meter worklet's count of the call's track (at the wire rate) while an answer plays
  if (speaking) {
    played[speaking] = (played[speaking] || 0) + report.samples;
    stats.playedByResponse = played;
    stats.playedSamples += report.samples;
    stats.receivedSamples += report.samples;
    const owner = stats.turns.find((t) => t.responseId === speaking);
    if (owner) owner.receivedSamples += report.samples;
  }
  // time to first audio as the user hears it: the first loud sample after their turn ended
  if (report.loud && turn && turn.ttfpMs === null && speaking && speaking === turn.responseId) {
    turn.ttfpMs = report.at - turn.endedAt;
  }
  if (report.at - renderedAt >= 100) { // the meter reports every 20 ms; the table shows ten a second
    renderedAt = report.at;
    renderTimings();
  }
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
  "output_audio_buffer.started": (event) => {
    speaking = event.response_id;
  },
  "output_audio_buffer.stopped": (event) => {
    if (speaking === event.response_id) speaking = null;
  },
  "output_audio_buffer.cleared": (event) => {
    // WebRTC: the server cut the answer's playback (the user spoke over it, or the page asked)
    if (speaking === event.response_id) speaking = null;
    const owner = stats.turns.find((t) => t.responseId === event.response_id);
    if (owner && owner.end !== "barge-in") {
      stats.bargeIns += 1;
      owner.end = "barge-in";
      renderTimings();
    }
  },
  "conversation.item.truncated": (event) => {
    const owner = stats.turns.find((t) => t.itemId === event.item_id);
    if (owner) owner.truncatedMs = event.audio_end_ms;
  },
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
  micStream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation,
    noiseSuppression: echoCancellation, autoGainControl: echoCancellation } });
  const capture = new AudioWorkletNode(context, "capture-processor");
  capture.port.onmessage = (event) => captured(event.data);
  context.createMediaStreamSource(micStream).connect(capture);
  player = new AudioWorkletNode(context, "playback-processor", { outputChannelCount: [1] });
  player.port.onmessage = (event) => {
    if (!link || link.kind !== "websocket") return; // over WebRTC the meter counts what plays
    played = event.data.played;
    stats.playedByResponse = played;
    stats.playedSamples = Object.values(played).reduce((a, b) => a + b, 0);
    acknowledgePlayback();
    renderTimings();
  };
  player.connect(context.destination);
  await context.resume();
}

function setMicrophone() {
  // over WebRTC the track is the microphone: with push to talk it is live only while held
  const live = !link || link.kind !== "webrtc" || mode() === "vad" || talking;
  for (const track of micStream.getAudioTracks()) track.enabled = live;
}

function openSocket(key) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const path = $("duplex").checked ? "/v1/duplex" : "/v1/realtime";
  const socket = new WebSocket(`${scheme}://${location.host}${path}`, ["realtime", ...(key ? [`openai-insecure-api-key.${key}`] : [])]);
  link = { kind: "websocket", open: () => socket.readyState === WebSocket.OPEN, send: (text) => socket.send(text),
    close: () => socket.close(1000, "client_close") };
  socket.onopen = () => send(sessionUpdate()); // on the duplex lane this opens the session
  socket.onmessage = onServerEvent;
  socket.onclose = (event) => closed(`${event.code}${event.reason ? ": " + event.reason : ""}`);
}

function iceGathered(pc) {
  // the offer carries every candidate (the server does no trickle ICE); host candidates come at once
  return new Promise((resolve) => {
    if (pc.iceGatheringState === "complete") return resolve();
    pc.addEventListener("icegatheringstatechange", () => pc.iceGatheringState === "complete" && resolve());
    setTimeout(resolve, 3000);
  });
}

function listen(stream) {
  // the answer plays through a media element (the browser's echo canceller hears it there);
  // a meter worklet on the same stream counts what arrives, for TTFP and the played counts
  $("speaker").srcObject = stream;
  const meter = new AudioWorkletNode(context, "meter-processor");
  meter.port.onmessage = (event) => heardOnTrack({ ...event.data, at: performance.now() });
  context.createMediaStreamSource(stream).connect(meter);
}

class CallRefused extends Error {} // the server's error answer to the call request

async function openCall(key) {
  // POST /v1/realtime/calls with the SDP offer; null if this server has no WebRTC calls
  const pc = new RTCPeerConnection();
  for (const track of micStream.getAudioTracks()) pc.addTrack(track, micStream);
  const channel = pc.createDataChannel("oai-events");
  pc.ontrack = (event) => listen(event.streams[0] || new MediaStream([event.track]));
  await pc.setLocalDescription(await pc.createOffer());
  await iceGathered(pc);
  const auth = key ? { Authorization: `Bearer ${key}` } : {};
  const answer = await fetch("/v1/realtime/calls", { method: "POST", body: pc.localDescription.sdp,
    headers: { "Content-Type": "application/sdp", ...auth } });
  if (answer.status === 404 || answer.status === 405) {
    pc.close();
    return false;
  }
  if (!answer.ok) {
    pc.close();
    const body = await answer.json().catch(() => ({ error: { message: answer.statusText } }));
    throw new CallRefused(`${body.error.code || answer.status}: ${body.error.message}`);
  }
  const call = answer.headers.get("Location");
  await pc.setRemoteDescription({ type: "answer", sdp: await answer.text() });
  link = { kind: "webrtc", open: () => channel.readyState === "open", send: (text) => channel.send(text),
    close: () => {
      if (call) fetch(`${call}/hangup`, { method: "POST", headers: auth });
      pc.close();
      closed("client_close");
    } };
  channel.onopen = () => send(sessionUpdate());
  channel.onmessage = onServerEvent;
  pc.onconnectionstatechange = () => {
    if (["failed", "closed"].includes(pc.connectionState) && link && link.kind === "webrtc") closed(pc.connectionState);
  };
  return true;
}

function closed(reason) {
  if (player) player.port.postMessage({ type: "clear" });
  $("speaker").srcObject = null;
  link = null;
  turn = null;
  speaking = null;
  pending = [];
  pendingSamples = 0;
  talking = false;
  setState(`closed (${reason})`);
  $("connect").textContent = "Start";
  $("talk").disabled = true;
}

async function connect() {
  $("error").textContent = "";
  setState("connecting");
  const key = $("api-key").value.trim();
  try {
    if (!player) await startAudio();
    if (transport() !== "webrtc" || !(await openCall(key))) openSocket(key); // WebSocket: the fallback
  } catch (error) {
    if (micStream) micStream.getTracks().forEach((track) => track.stop());
    if (context) context.close();
    context = player = micStream = null;
    setState("not connected");
    showError(error instanceof CallRefused ? error.message : `microphone, audio or WebRTC: ${error.message}`);
    return;
  }
  stats.transport = link.kind;
  setMicrophone();
  $("connect").textContent = "Stop";
  $("talk").disabled = mode() !== "ptt";
}

function disconnect() {
  if (link) link.close();
}

function holdTalk(down) {
  if (mode() !== "ptt" || !link || talking === down) return;
  talking = down;
  $("talk").setAttribute("aria-pressed", String(down));
  if (down) {
    bargeIn();
    if (link.kind === "webrtc") send({ type: "input_audio_buffer.clear" }); // the silence sent while not held
    setMicrophone();
    setState("hearing you");
    return;
  }
  const commit = () => {
    setMicrophone();
    send({ type: "input_audio_buffer.commit" });
    turnEnded();
    send({ type: "response.create" });
  };
  if (link.kind === "webrtc") {
    setTimeout(commit, 150); // the last of the speech is still on its way on the track
  } else {
    flushAudio();
    commit();
  }
}

$("connect").addEventListener("click", () => (link ? disconnect() : connect()));
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
    $("talk").disabled = !link || mode() !== "ptt";
    if (link) setMicrophone();
    send(sessionUpdate());
  });
}
