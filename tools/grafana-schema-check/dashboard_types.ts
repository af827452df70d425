// The type dashboards/*.json must have: @grafana/schema's Dashboard, with
// the panels this project uses typed by their plugin's options (the schema
// leaves a panel's options as Record<string, unknown>). Used by
// tests/dashboard_schema_test.sh, which assigns each dashboard's JSON text,
// as an object literal, to a constant of this type and runs tsc --noEmit:
// fields of the wrong type, missing required options (legend.calcs) and
// unknown fields (excess property checks) are compile errors.
import type {
  Dashboard,
  GraphFieldConfig,
  OptionsWithLegend,
  OptionsWithTooltip,
  Panel,
  RowPanel,
} from '@grafana/schema';

// JSON cannot spell a TypeScript string enum member ('list' is not
// LegendDisplayMode.List), so string enums become the union of their
// values; everything else keeps its type, recursively.
export type Json<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends Array<infer E>
      ? Array<Json<E>>
      : T extends object
        ? { [K in keyof T]: Json<T[K]> }
        : T;

// A "timeseries" panel: its options as the plugin defines them.
export type TimeSeriesPanel = Omit<
  Panel<OptionsWithLegend & OptionsWithTooltip, GraphFieldConfig>,
  'type' | 'options'
> & {
  type: 'timeseries';
  options: OptionsWithLegend & OptionsWithTooltip;
};

// Add a panel type here (with its plugin's options) before a dashboard
// uses it.
export type CheckedPanel = TimeSeriesPanel | RowPanel;

export type CheckedDashboard = Json<Omit<Dashboard, 'panels'> & { panels: CheckedPanel[] }>;
