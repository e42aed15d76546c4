// The BullMQ side of benchmarks/peers.py (npm install in this folder first).
//   node bullmq_worker.mjs              a Worker on queue BULLMQ_QUEUE, BULLMQ_CONCURRENCY (default 1)
//   node bullmq_worker.mjs push N       add N no-op jobs (addBulk, 1,000 a call), then exit
//   node bullmq_worker.mjs stamp R S    add R stamp jobs/s for S seconds (queue.add each), then exit
// Redis: TIDINGS_REDIS_URL. A stamp job appends `now - sent_at` (seconds) to BENCH_LATENCY_KEY.
import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";

const url = new URL(process.env.TIDINGS_REDIS_URL);
const connection = { host: url.hostname, port: Number(url.port), maxRetriesPerRequest: null };
const name = process.env.BULLMQ_QUEUE || "bench";
const [mode, a, b] = process.argv.slice(2);
const now = () => (performance.timeOrigin + performance.now()) / 1000;

if (mode === "push") {
  const queue = new Queue(name, { connection });
  const n = Number(a);
  for (let i = 0; i < n; i += 1000) {
    const jobs = [];
    for (let j = i; j < Math.min(n, i + 1000); j++) jobs.push({ name: "noop", data: { n: j } });
    await queue.addBulk(jobs);
  }
  await queue.close();
} else if (mode === "stamp") {
  const queue = new Queue(name, { connection });
  const perS = Number(a);
  const count = Math.floor(perS * Number(b));
  const t0 = performance.now();
  for (let i = 0; i < count; i++) {
    const pause = t0 + (i * 1000) / perS - performance.now();
    if (pause > 0) await new Promise((r) => setTimeout(r, pause));
    await queue.add("stamp", { sentAt: now() });
  }
  await queue.close();
} else {
  const client = new IORedis(connection);
  const key = process.env.BENCH_LATENCY_KEY || "latency";
  const worker = new Worker(
    name,
    async (job) => {
      if (job.name === "stamp") {
        const started = now();
        await client.rpush(key, (started - job.data.sentAt).toFixed(6));
      }
    },
    { connection, concurrency: Number(process.env.BULLMQ_CONCURRENCY || 1) },
  );
  const stop = async () => {
    setTimeout(() => process.exit(1), 5000).unref(); // Redis gone: close() would wait forever
    await worker.close();
    await client.quit();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
