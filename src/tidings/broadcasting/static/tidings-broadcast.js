/* tidings broadcast helper (optional: a plain EventSource works the same).
 *
 *   const sub = TidingsBroadcast.subscribe("/broadcast", ["orders", "private-orders.42"], {
 *     OrderShipped: (data, msg) => console.log(msg.channel, data),
 *     notification: (data) => show(data),
 *   });
 *   sub.close();
 *
 * Each handler gets the message's data and {channel, event, id}. options: token,
 * withCredentials, onerror, ongap(channel) (messages left the replay window: reload). The browser reconnects
 * by itself and sends Last-Event-ID, so nothing within the stream window is missed.
 */
(function (root) {
  "use strict";
  function subscribe(url, channels, handlers, options) {
    var opts = options || {};
    var q = [].concat(channels).map(function (c) {
      return "channel=" + encodeURIComponent(c);
    });
    if (opts.token) q.push("token=" + encodeURIComponent(opts.token));
    var full = url + (url.indexOf("?") < 0 ? "?" : "&") + q.join("&");
    var source = new EventSource(full, { withCredentials: !!opts.withCredentials });
    Object.keys(handlers || {}).forEach(function (name) {
      source.addEventListener(name, function (e) {
        var msg = JSON.parse(e.data);
        handlers[name](msg.data, { channel: msg.channel, event: name, id: e.lastEventId });
      });
    });
    if (opts.ongap) {
      source.addEventListener("tidings.gap", function (e) { opts.ongap(JSON.parse(e.data).channel); });
    }
    if (opts.onerror) source.onerror = opts.onerror;
    return { source: source, close: function () { source.close(); } };
  }
  root.TidingsBroadcast = { subscribe: subscribe };
})(typeof window !== "undefined" ? window : this);
