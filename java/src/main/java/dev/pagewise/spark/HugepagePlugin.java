package dev.pagewise.spark;

import java.util.Collections;
import java.util.Map;
import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;

/**
 * {@code spark.plugins=dev.pagewise.spark.HugepagePlugin}: installs {@link HugepageAgent} in
 * the driver and in every executor by self-attach, and logs its status there. The jar must be
 * on {@code spark.driver.extraClassPath} and {@code spark.executor.extraClassPath}.
 */
public final class HugepagePlugin implements SparkPlugin {
  @Override
  public DriverPlugin driverPlugin() {
    return new DriverPlugin() {
      @Override
      public Map<String, String> init(SparkContext sc, PluginContext ctx) {
        HugepageAgent.ensureInstalled();
        return Collections.emptyMap();
      }
    };
  }

  @Override
  public ExecutorPlugin executorPlugin() {
    return new ExecutorPlugin() {
      @Override
      public void init(PluginContext ctx, Map<String, String> extraConf) {
        HugepageAgent.ensureInstalled();
      }
    };
  }
}
