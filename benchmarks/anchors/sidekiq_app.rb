# The Sidekiq side of benchmarks/peers.py: a no-op job and a stamp job, loaded with
#   sidekiq -r ./benchmarks/anchors/sidekiq_app.rb -c N
# The Python side pushes jobs in Sidekiq's own wire format (LPUSH queue:default) and
# reads the stamp job's records from BENCH_LATENCY_KEY. Redis: TIDINGS_REDIS_URL.
require "sidekiq"

# Debian pairs Sidekiq 6.4 with redis-rb 4.8, which warns on stderr at every BRPOP that
# Sidekiq's fetch makes (a positional timeout): silenced, or the warnings would be timed.
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

Sidekiq.configure_server do |config|
  config.redis = {url: ENV.fetch("TIDINGS_REDIS_URL")}
  config.logger.level = Logger::WARN
end

class NoopJob
  include Sidekiq::Worker

  def perform(n)
  end
end

class StampJob
  include Sidekiq::Worker

  def perform(sent_at)
    started = Time.now.to_f
    Sidekiq.redis { |c| c.rpush(ENV.fetch("BENCH_LATENCY_KEY"), format("%.6f", started - sent_at)) }
  end
end
