// The rendezvous store's server and client (runtime/store.ts), in one process: the protocol's
// commands, and drain, which keeps a failed host rank's store up while other ranks are connected.
import { describe, expect, it } from 'vitest';
import { StoreClient, StoreServer } from '../../runtime/store.js';

async function withStore(
  f: (server: StoreServer, connect: () => Promise<StoreClient>) => Promise<void>,
) {
  const server = await StoreServer.listen(0, '127.0.0.1');
  const clients: StoreClient[] = [];
  try {
    await f(server, async () => {
      const c = await StoreClient.connect('127.0.0.1', server.port, 5_000);
      clients.push(c);
      return c;
    });
  } finally {
    for (const c of clients) c.close();
    await server.close();
  }
}

describe('store', () => {
  it('set, get, add and wait', async () => {
    await withStore(async (_, connect) => {
      const [a, b] = [await connect(), await connect()];
      expect(await a.get('k')).toBeUndefined();
      const waited = b.wait(['k', 'n']);
      await a.set('k', 'v');
      expect(await a.add('n', 3)).toBe(3);
      expect(await b.add('n', -1)).toBe(2);
      await waited;
      expect((await b.get('k'))?.toString()).toBe('v');
    });
  });

  it('drain waits for the connections named other than its own, and no longer', async () => {
    await withStore(async (server, connect) => {
      const own = await connect();
      const other = await connect();
      const anonymous = await connect();
      await own.hello('0');
      await other.hello('1');
      await anonymous.get('x');
      let drained = false;
      const d = server.drain('0', 30_000).then(() => (drained = true));
      await new Promise((r) => setTimeout(r, 100));
      expect(drained).toBe(false);
      other.close();
      await d;
      expect(drained).toBe(true);
      // nothing named other than its own: at once
      await server.drain('0', 30_000);
    });
  });

  it('drain gives up after its time', async () => {
    await withStore(async (server, connect) => {
      await (await connect()).hello('1');
      const t0 = Date.now();
      await server.drain('0', 200);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(190);
    });
  });
});
