// The rendezvous store: a small TCP key-value server the launcher hosts (or rank 0, when a
// cluster manager started the ranks), where ranks meet to open their Gloo connections
// (runtime-native/src/comm/store.h is its C++ client) and launchers post a failure for the others.
//
// Protocol, little-endian. A request: a command byte, a u32 count of strings, the strings (u32
// length, bytes). A reply: a u32 length and its bytes. Requests on one connection are answered in
// order; a wait holds the connection's later requests until it is answered.
//   1 set  [key, value]      → ""
//   2 get  [key]             → 1 + value, or 0 when absent
//   3 wait [key, …]          → 1 once every key is set
//   4 add  [key, i64 delta]  → the new i64 value (an absent key counts as 0)
//   5 hello [name]           → ""; names the connection (a rank's native client: its rank)

import { createConnection, createServer, type Server, type Socket } from 'node:net';

const SET = 1;
const GET = 2;
const WAIT = 3;
const ADD = 4;
const HELLO = 5;

/** Splits a byte stream into requests (server side) or replies (client side). */
class FrameReader {
  private buf: Buffer = Buffer.alloc(0);
  push(chunk: Buffer): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
  }
  /** the next request: [command, strings], or undefined until it has fully arrived */
  request(): [number, Buffer[]] | undefined {
    if (this.buf.length < 5) return undefined;
    const count = this.buf.readUInt32LE(1);
    const parts: Buffer[] = [];
    let at = 5;
    for (let i = 0; i < count; i++) {
      if (this.buf.length < at + 4) return undefined;
      const len = this.buf.readUInt32LE(at);
      if (this.buf.length < at + 4 + len) return undefined;
      parts.push(this.buf.subarray(at + 4, at + 4 + len));
      at += 4 + len;
    }
    const cmd = this.buf[0];
    this.buf = this.buf.subarray(at);
    return [cmd, parts];
  }
  reply(): Buffer | undefined {
    if (this.buf.length < 4) return undefined;
    const len = this.buf.readUInt32LE(0);
    if (this.buf.length < 4 + len) return undefined;
    const r = this.buf.subarray(4, 4 + len);
    this.buf = this.buf.subarray(4 + len);
    return r;
  }
}

function frame(payload: Buffer): Buffer {
  const head = Buffer.alloc(4);
  head.writeUInt32LE(payload.length);
  return Buffer.concat([head, payload]);
}

function encodeRequest(cmd: number, parts: readonly Buffer[]): Buffer {
  const head = Buffer.alloc(5);
  head[0] = cmd;
  head.writeUInt32LE(parts.length, 1);
  const out: Buffer[] = [head];
  for (const p of parts) {
    const len = Buffer.alloc(4);
    len.writeUInt32LE(p.length);
    out.push(len, p);
  }
  return Buffer.concat(out);
}

export class StoreServer {
  private readonly values = new Map<string, Buffer>();
  private readonly waiters: { keys: string[]; done: () => void }[] = [];
  private readonly sockets = new Set<Socket>();
  /** the name each connection gave itself (hello) */
  private readonly names = new Map<Socket, string>();
  private readonly closeListeners = new Set<() => void>();

  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  /** Listens on host:port (port 0: any free port). */
  static async listen(port: number, host = '0.0.0.0'): Promise<StoreServer> {
    const server = createServer();
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => resolve());
    });
    const address = server.address();
    const s = new StoreServer(server, typeof address === 'object' && address ? address.port : port);
    server.on('connection', (sock) => s.serve(sock));
    return s;
  }

  set(key: string, value: Buffer): void {
    this.values.set(key, value);
    for (let i = this.waiters.length - 1; i >= 0; i--) {
      const w = this.waiters[i];
      if (w.keys.every((k) => this.values.has(k))) {
        this.waiters.splice(i, 1);
        w.done();
      }
    }
  }

  get(key: string): Buffer | undefined {
    return this.values.get(key);
  }

  /**
   * Resolves once no connection named other than `own` is open, or after `maxMs`: a rank that
   * hosts the store and failed keeps it until the other ranks, which look its reason up there
   * when their connections with it close, have gone (or gave up).
   */
  async drain(own: string, maxMs: number): Promise<void> {
    const deadline = Date.now() + maxMs;
    const others = () => [...this.names.values()].some((n) => n !== own);
    while (others() && Date.now() < deadline) await this.nextClose(deadline - Date.now());
  }

  /** Resolves when a connection closes, or after `ms`. */
  private nextClose(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.closeListeners.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.closeListeners.add(done);
    });
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private serve(sock: Socket): void {
    this.sockets.add(sock);
    sock.setNoDelay(true);
    const reader = new FrameReader();
    // requests of one connection are answered in order: a wait holds the ones behind it
    let busy = false;
    const pump = (): void => {
      while (!busy) {
        const req = reader.request();
        if (!req) return;
        const answer = this.handle(sock, req[0], req[1]);
        if (answer instanceof Promise) {
          busy = true;
          void answer.then((r) => {
            if (!sock.destroyed) sock.write(frame(r));
            busy = false;
            pump();
          });
        } else sock.write(frame(answer));
      }
    };
    sock.on('data', (chunk: Buffer) => {
      reader.push(chunk);
      pump();
    });
    sock.on('error', () => sock.destroy());
    sock.on('close', () => {
      this.sockets.delete(sock);
      this.names.delete(sock);
      for (const f of [...this.closeListeners]) f();
    });
  }

  private handle(sock: Socket, cmd: number, parts: Buffer[]): Buffer | Promise<Buffer> {
    const key = parts[0]?.toString('utf8') ?? '';
    switch (cmd) {
      case SET:
        this.set(key, Buffer.from(parts[1] ?? Buffer.alloc(0)));
        return Buffer.alloc(0);
      case GET: {
        const v = this.values.get(key);
        return v ? Buffer.concat([Buffer.from([1]), v]) : Buffer.from([0]);
      }
      case WAIT: {
        const keys = parts.map((p) => p.toString('utf8'));
        if (keys.every((k) => this.values.has(k))) return Buffer.from([1]);
        return new Promise((resolve) =>
          this.waiters.push({ keys, done: () => resolve(Buffer.from([1])) }),
        );
      }
      case ADD: {
        const old = this.values.get(key);
        const next =
          (old && old.length === 8 ? old.readBigInt64LE() : 0n) + parts[1].readBigInt64LE();
        const out = Buffer.alloc(8);
        out.writeBigInt64LE(next);
        this.set(key, out);
        return out;
      }
      case HELLO:
        this.names.set(sock, key);
        return Buffer.alloc(0);
      default:
        return Buffer.alloc(0);
    }
  }
}

/** A client of the store (the launchers' side; ranks use the C++ one). */
export class StoreClient {
  private readonly reader = new FrameReader();
  private readonly pending: { resolve: (r: Buffer) => void; reject: (e: Error) => void }[] = [];
  private closed: Error | undefined;
  private readonly onClose: ((e: Error) => void)[] = [];

  private constructor(private readonly sock: Socket) {
    sock.setNoDelay(true);
    sock.on('data', (chunk: Buffer) => {
      this.reader.push(chunk);
      for (let r = this.reader.reply(); r; r = this.reader.reply())
        this.pending.shift()?.resolve(r);
    });
    const lost = (e?: Error) => {
      if (this.closed) return;
      this.closed = e ?? new Error('the store closed the connection');
      for (const p of this.pending.splice(0)) p.reject(this.closed);
      for (const f of this.onClose) f(this.closed);
    };
    sock.on('error', lost);
    sock.on('close', () => lost());
  }

  /** Connects to host:port, retrying until timeoutMs (the store may start after this client). */
  static async connect(host: string, port: number, timeoutMs: number): Promise<StoreClient> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        const sock = await new Promise<Socket>((resolve, reject) => {
          const s = createConnection({ host, port }, () => resolve(s));
          s.once('error', reject);
        });
        return new StoreClient(sock);
      } catch (e) {
        if (Date.now() > deadline)
          throw new Error(`cannot reach the store at ${host}:${port}: ${(e as Error).message}`, {
            cause: e,
          });
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }

  /** Called once if the connection goes away. */
  whenClosed(f: (e: Error) => void): void {
    this.onClose.push(f);
  }

  set(key: string, value: string | Buffer): Promise<void> {
    return this.request(SET, [key, value]).then(() => undefined);
  }

  async get(key: string): Promise<Buffer | undefined> {
    const r = await this.request(GET, [key]);
    return r[0] === 1 ? r.subarray(1) : undefined;
  }

  wait(keys: readonly string[]): Promise<void> {
    return this.request(WAIT, keys).then(() => undefined);
  }

  async add(key: string, delta: number): Promise<number> {
    const d = Buffer.alloc(8);
    d.writeBigInt64LE(BigInt(delta));
    return Number((await this.request(ADD, [key, d])).readBigInt64LE());
  }

  /** Names this connection to the server (see StoreServer.drain). */
  hello(name: string): Promise<void> {
    return this.request(HELLO, [name]).then(() => undefined);
  }

  close(): void {
    this.closed ??= new Error('closed');
    this.sock.destroy();
  }

  private request(cmd: number, parts: readonly (string | Buffer)[]): Promise<Buffer> {
    if (this.closed) return Promise.reject(this.closed);
    const buffers = parts.map((p) => (typeof p === 'string' ? Buffer.from(p, 'utf8') : p));
    return new Promise((resolve, reject) => {
      this.pending.push({ resolve, reject });
      this.sock.write(encodeRequest(cmd, buffers));
    });
  }
}
