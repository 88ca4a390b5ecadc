package dev.pagewise.ycsb;

import java.io.IOException;
import java.io.StringWriter;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.Vector;
import java.util.concurrent.TimeUnit;

import net.spy.memcached.ConnectionFactoryBuilder;
import net.spy.memcached.FailureMode;
import net.spy.memcached.internal.OperationFuture;

import org.codehaus.jackson.JsonFactory;
import org.codehaus.jackson.JsonGenerator;
import org.codehaus.jackson.JsonNode;
import org.codehaus.jackson.map.ObjectMapper;
import org.codehaus.jackson.node.ObjectNode;

import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;
import site.ycsb.StringByteIterator;

/**
 * YCSB binding for memcached-protocol servers (memcached, pagewise-kvcache), behaving like
 * YCSB's own memcached binding: the text protocol through spymemcached; insert = add,
 * read = get, update = replace, delete = delete; scan is not supported; every record is one
 * item whose value is the record's fields as one JSON object of strings; items never expire
 * (exptime 2147483647, an absolute Unix time in 2038).
 *
 * <p>Properties (same names as upstream): memcached.hosts (host[:port], comma separated,
 * required), memcached.opTimeoutMillis (60000), memcached.shutdownTimeoutMillis (30000),
 * memcached.objectExpirationTime (2147483647), memcached.checkOperationStatus (true),
 * memcached.failureMode (Redistribute), memcached.protocol (ascii only).
 */
public class MemcachedClient extends DB {
  private static final ObjectMapper MAPPER = new ObjectMapper();
  private static final int DEFAULT_PORT = 11211;

  private net.spy.memcached.MemcachedClient client;
  private boolean checkOperationStatus;
  private long shutdownTimeoutMillis;
  private int objectExpirationTime;

  @Override
  public void init() throws DBException {
    Properties p = getProperties();
    String hosts = p.getProperty("memcached.hosts");
    if (hosts == null || hosts.isBlank()) {
      throw new DBException("memcached.hosts is required (host[:port],...)");
    }
    if (!"ascii".equals(p.getProperty("memcached.protocol", "ascii"))) {
      throw new DBException("memcached.protocol: only ascii is supported");
    }
    checkOperationStatus = Boolean.parseBoolean(p.getProperty("memcached.checkOperationStatus", "true"));
    shutdownTimeoutMillis = Long.parseLong(p.getProperty("memcached.shutdownTimeoutMillis", "30000"));
    objectExpirationTime = Integer.parseInt(p.getProperty("memcached.objectExpirationTime",
        String.valueOf(Integer.MAX_VALUE)));
    long opTimeout = Long.parseLong(p.getProperty("memcached.opTimeoutMillis", "60000"));
    FailureMode failureMode = FailureMode.valueOf(p.getProperty("memcached.failureMode", "Redistribute"));
    List<InetSocketAddress> addrs = new ArrayList<>();
    for (String h : hosts.split(",")) {
      String host = h.trim();
      int colon = host.lastIndexOf(':');
      if (colon > 0) {
        addrs.add(new InetSocketAddress(host.substring(0, colon), Integer.parseInt(host.substring(colon + 1))));
      } else {
        addrs.add(new InetSocketAddress(host, DEFAULT_PORT));
      }
    }
    ConnectionFactoryBuilder b = new ConnectionFactoryBuilder()
        .setProtocol(ConnectionFactoryBuilder.Protocol.TEXT)
        .setOpTimeout(opTimeout)
        .setFailureMode(failureMode)
        .setDaemon(true);
    try {
      client = new net.spy.memcached.MemcachedClient(b.build(), addrs);
    } catch (IOException e) {
      throw new DBException("connecting to " + hosts + ": " + e, e);
    }
  }

  @Override
  public void cleanup() throws DBException {
    if (client != null) {
      client.shutdown(shutdownTimeoutMillis, TimeUnit.MILLISECONDS);
    }
  }

  /** Upstream's item key: table-key. */
  static String qualifiedKey(String table, String key) {
    return table + "-" + key;
  }

  @Override
  public Status read(String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
    try {
      Object doc = client.get(qualifiedKey(table, key));
      if (doc == null) {
        return Status.NOT_FOUND;
      }
      fromJson((String) doc, fields, result);
      return Status.OK;
    } catch (Exception e) {
      System.err.println("read " + key + ": " + e);
      return Status.ERROR;
    }
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
      Vector<HashMap<String, ByteIterator>> result) {
    return Status.NOT_IMPLEMENTED;
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    try {
      return status(client.replace(qualifiedKey(table, key), objectExpirationTime, toJson(values)));
    } catch (Exception e) {
      System.err.println("update " + key + ": " + e);
      return Status.ERROR;
    }
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    try {
      return status(client.add(qualifiedKey(table, key), objectExpirationTime, toJson(values)));
    } catch (Exception e) {
      System.err.println("insert " + key + ": " + e);
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      return status(client.delete(qualifiedKey(table, key)));
    } catch (Exception e) {
      System.err.println("delete " + key + ": " + e);
      return Status.ERROR;
    }
  }

  private Status status(OperationFuture<Boolean> f) throws Exception {
    if (!checkOperationStatus) {
      return Status.OK;
    }
    return f.get() ? Status.OK : Status.ERROR;
  }

  static String toJson(Map<String, ByteIterator> values) throws IOException {
    ObjectNode node = MAPPER.createObjectNode();
    for (Map.Entry<String, String> e : StringByteIterator.getStringMap(values).entrySet()) {
      node.put(e.getKey(), e.getValue());
    }
    StringWriter w = new StringWriter();
    JsonGenerator g = new JsonFactory().createJsonGenerator(w);
    MAPPER.writeTree(g, node);
    g.close();
    return w.toString();
  }

  static void fromJson(String value, Set<String> fields, Map<String, ByteIterator> dest) throws IOException {
    JsonNode json = MAPPER.readTree(value);
    boolean all = fields == null;
    for (Iterator<Map.Entry<String, JsonNode>> it = json.getFields(); it.hasNext();) {
      Map.Entry<String, JsonNode> f = it.next();
      if (all || fields.contains(f.getKey())) {
        dest.put(f.getKey(), new StringByteIterator(f.getValue().asText()));
      }
    }
  }
}
